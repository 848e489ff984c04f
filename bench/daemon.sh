#!/bin/bash
# The daemon side of the benchmark (issue 4, docs/design.md §8), run inside the lab guest after
# bench/fence.sh and bench/batch.sh (bench/run boots it). Two daemons, A and B, each with its own
# configuration, socket and log under /tmp/bf/<node> and only its own nexuses (the map's sg nodes of
# that node), as tests/lab/daemon/lib.sh runs them; resource "db" (exclusive) on the first N LUs, N
# in $BENCH_SIZES, check_interval 250 ms, keys_every 4.
#
#   raw-rt        one READ RESERVATION batch over the N LUs through B's nexuses (blkfencectl device
#                 reservation --json: the slowest command's latency, "blkfencectl-batch"; and the
#                 whole command, "blkfencectl"), no daemon running: the goal's "raw PR round trip".
#   acquire-*     A holds; `blkfencectl acquire db --json` on B preempts it (preempt, and
#                 preempt-and-abort): the whole command ("blkfencectl") and the daemon's own
#                 duration ("blkfenced", the reply's elapsed_ms). Verified: B's key is the only key
#                 and the holder on every LU, read through A's nexuses (blkfencectl device for all,
#                 sg_persist for the first and the last).
#   detect-*      in the same runs, A's "fenced" event as `blkfencectl watch db --json` on A shows
#                 it, each line stamped with the wall clock when it arrives, counted from just
#                 before B's acquire command is issued ("from-issue"), from its return
#                 ("from-return"), and from the start and the end of B's operation in B's daemon
#                 ("from-daemon-start", "from-daemon-end": the end is the wall-clock stamp of B's
#                 "acquired" log record, the start elapsed_ms before it); and A's own "gate closed"
#                 log record from the same two ("gate-from-daemon-start", "gate-from-daemon-end").
#                 B's PREEMPT lands inside its operation, so start and end bound the detection
#                 latency from both sides. B's acquire is issued after a random pause of 0-250 ms,
#                 at a random phase of A's checks. Verified: A's status is fenced, by B's key.
#   monitor-cpu   A alone holds the largest N LUs at 4 Hz; utime + stime ("monitor-cpu") and stime
#                 alone ("monitor-cpu-kernel") of its blkfenced from /proc/PID/stat over a
#                 $BENCH_CPU_SECONDS (60) s window, as % of one core, with transport = "uring" and
#                 "sgio"; with the checks per second and the mean check latency of that window from
#                 its metrics, and the window's length ("monitor-window"). Verified: still held,
#                 gate open.
#   cpu-reference a python loop and one clock_gettime() call timed in the guest; report.py times
#                 the same on the host: how much TCG inflates CPU time.
#
# Output: TSV lines "measure variant n value verified" in $BENCH_DAEMON_OUT (daemon.tsv next to
# bench.tsv); values in seconds, except monitor-cpu* (% of one core) and checks-per-second.
# Acquire runs repeat $BENCH_DAEMON_REPEATS times (default $BENCH_REPEATS, at least 5: under TCG
# single runs vary by 2-3x), raw round trips at least 5 times. The daemons' logs end up in
# $BLKFENCE_LAB_OUT/blkfenced-{A,B}.log, A's watch streams in watch-A.PREEMPT.N.log.
set -u
. "$BLKFENCE_LAB_REPO/bench/fence.sh" --functions-only  # guest.sh, now, elapsed, ctl, reset, sizes, repeats
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
dout=${BENCH_DAEMON_OUT:-$BLKFENCE_LAB_OUT/daemon.tsv}
interval_ms=250
cpu_seconds=${BENCH_CPU_SECONDS:-60}
raw_repeats=$((repeats > 5 ? repeats : 5))
acquire_repeats=${BENCH_DAEMON_REPEATS:-$raw_repeats}
mapfile -t a_sg_all < <(awk -F'\t' '$1 == "A" {print $6}' "$BLKFENCE_LAB_MAP")
mapfile -t b_sg_all < <(awk -F'\t' '$1 == "B" {print $6}' "$BLKFENCE_LAB_MAP")
echo -e "measure\tvariant\tn\tvalue\tverified" >"$dout"
rm -rf "$BF"
mkdir -p "$BF/A" "$BF/B"

emit() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" | tee -a "$dout"; }
since() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.4f", b - a}'; }
problems=0
note() { echo "bench/daemon.sh: $*"; }
problem() { problems=$((problems + 1)); note "$@"; }

# bd_config NODE NODE_ID PREEMPT N TRANSPORT: NODE's configuration, resource "db" on the first N
# LUs by NODE's own sg paths.
bd_config() {
  local node=$1 id=$2 preempt=$3 n=$4 transport=$5 dir=$BF/$1 d
  local -a devices=()
  local -n sgs=${node,,}_sg_all
  mkdir -p "$dir/state" "$dir/run"
  for d in "${sgs[@]:0:n}"; do devices+=("\"$d\""); done
  local IFS=,
  cat >"$dir/blkfence.toml" <<TOML
cluster = "lab"
node_id = $id
state_dir = "$dir/state"
run_dir = "$dir/run"
transport = "$transport"

[[resource]]
name = "db"
devices = [${devices[*]}]
preempt = "$preempt"
check_interval = "${interval_ms}ms"
keys_every = 4
lease = "3s"
command_timeout = "2s"
on_fenced = "none"
TOML
}

# bd_start NODE LABEL: starts NODE's daemon (a child of this shell, so that bf_stop can wait).
bd_start() {
  echo "=== bench/daemon.sh: $2 ===" >>"$BF/$1/log"
  bf_start "$1"
}

# bd_fresh N: no daemon, no key and no reservation on the first N LUs.
bd_fresh() {
  local node
  for node in A B; do
    [[ -f $BF/$node/pid ]] && bf_stop "$node"
    rm -f "$BF/$node/pid"
  done
  a=("${a_all[@]:0:$1}") b=("${b_all[@]:0:$1}")
  reset
}

# only_holder KEY: KEY is the only registered key and the holder of every LU, read through A's
# nexuses (one blkfencectl batch for all; sg_persist, unpadded hex, for the first and the last).
# Text tools only: a python3 start costs seconds under TCG.
only_holder() {
  local key=$1 short keys holders d
  short=$(printf '0x%x' "$((key))")
  keys=$("$BLKFENCECTL" device keys --json "${a[@]}" 2>/dev/null) || return 1
  holders=$("$BLKFENCECTL" device reservation --json "${a[@]}" 2>/dev/null) || return 1
  # Keys are the only "0x..." strings of `device keys --json`; one registration per LU (A's path).
  [[ $(grep -o '"0x[0-9a-f]*"' <<<"$keys" | sort | uniq -c | awk '{print $1, $2}') == "${#a[@]} \"$key\"" ]] || return 1
  [[ $(grep -o '"key": *"0x[0-9a-f]*"' <<<"$holders" | grep -o '"0x[0-9a-f]*"' | sort | uniq -c |
    awk '{print $1, $2}') == "${#a[@]} \"$key\"" ]] || return 1
  for d in "${a[0]}" "${a[-1]}"; do
    [[ $(lab_keys "$d" 2>/dev/null | tr '\n' ' ') == "$short " ]] || return 1
    lab_holder "$d" 2>/dev/null | grep -q "^$short " || return 1
  done
}

# bd_field NODE FIELD: a field of resource db's status (state, gate_open, key, fenced_by...), as
# lib.sh's bf_field, without python.
bd_field() {
  local json value
  json=$(bf_ctl "$1" status db --json 2>/dev/null) || return 1
  [[ $json =~ \"$2\":\ *(\"[^\"]*\"|true|false|null|[0-9]+) ]] || return 1
  value=${BASH_REMATCH[1]}
  value=${value#\"}
  echo "${value%\"}"
}
# bd_await NODE FIELD VALUE: waits up to 15 s until FIELD is VALUE.
bd_await() {
  local try
  for ((try = 0; try < 150; try++)); do
    [[ $(bd_field "$1" "$2") == "$3" ]] && return 0
    sleep 0.1
  done
  return 1
}

# The slowest command of a blkfencectl --json batch, in seconds.
batch_seconds() {
  grep -o '"latency_us": *[0-9]*' | awk -F: '{v = $2 + 0; if (v > m) m = v} END {printf "%.4f", m / 1e6}'
}

# raw_rt N: READ RESERVATION over the first N LUs through B's nexuses, no daemon running.
raw_rt() {
  local n=$1 r t json whole
  local -a sgs=("${b_sg_all[@]:0:n}")
  "$BLKFENCECTL" device reservation "${sgs[@]}" >/dev/null 2>&1  # takes the UAs of the reset
  for ((r = 0; r < raw_repeats; r++)); do
    t=$(now)
    json=$("$BLKFENCECTL" device reservation --json "${sgs[@]}" 2>&1)
    whole=$(elapsed "$t")
    if grep -q '"latency_us"' <<<"$json"; then
      emit raw-rt blkfencectl-batch "$n" "$(batch_seconds <<<"$json")" yes
      emit raw-rt blkfencectl "$n" "$whole" yes
    else
      problem "READ RESERVATION over $n LUs failed: $json"
    fi
  done
}

STAMP='import sys, time
for line in sys.stdin:
    sys.stdout.write("%.6f %s" % (time.time(), line))
    sys.stdout.flush()'

# log_stamp FILE PATTERN T0: the wall-clock stamp of the first record of a daemon's log matching
# PATTERN after T0.
log_stamp() {
  grep -- "$2" "$1" | sed -n 's/^<[0-9]*>\[\([0-9.]*\)\].*/\1/p' | awk -v t0="$3" '$1 > t0 { print; exit }'
}

# fenced_at FILE T0: the stamp of A's first "fenced" event after T0 in FILE (waits up to 10 s).
fenced_at() {
  local try stamp
  for ((try = 0; try < 200; try++)); do
    stamp=$(awk -v t0="$2" '$1 > t0 && /"event":"fenced"/ { print $1; exit }' "$1")
    [[ -n $stamp ]] && { echo "$stamp"; return 0; }
    sleep 0.05
  done
  return 1
}

# acquire_runs PREEMPT N: B acquires db from A, $acquire_repeats times.
acquire_runs() {
  local preempt=$1 n=$2 action=acquire-${1/preempt-and-abort/preempt-abort}
  local detect=detect-${1/preempt-and-abort/preempt-abort}
  local r t0 t1 t2 json rc key daemon_s b_start b_end a_gate verified watch_pid watch=$BF/A/watch.$preempt.$n b_held=0
  bd_fresh "$n"
  bd_config A 1 "$preempt" "$n" auto
  bd_config B 2 "$preempt" "$n" auto
  bd_start A "$preempt, $n LUs" || { problem "A's daemon did not start"; return 1; }
  bd_start B "$preempt, $n LUs" || { problem "B's daemon did not start"; return 1; }
  # Each line stamped when it arrives. Not with bash's read as e2e.sh does: it reads a pipe one
  # byte at a time, and at 64 LUs a status line is about 10 KB, which under TCG delays the stamp
  # by up to 0.4 s.
  bf_ctl A watch db --json 2>/dev/null | python3 -u -c "$STAMP" >"$watch" &
  watch_pid=$!
  for ((r = 0; r < 200; r++)); do [[ -s $watch ]] && break; sleep 0.1; done
  for ((r = 0; r < acquire_repeats; r++)); do
    if ! json=$(bf_ctl A acquire db --timeout 30s 2>&1); then
      problem "A's acquire ($preempt, $n LUs) failed: $json"
      continue
    fi
    # B must have seen that it is fenced, or its acquire answers at once from its held state.
    if ((b_held)) && ! bd_await B state fenced; then
      problem "B did not notice A's acquire ($preempt, $n LUs): $(bd_field B state)"
      continue
    fi
    # A random pause, so that B's preempt lands at a random phase of A's 250 ms checks (the
    # script's own steps would otherwise keep it at about the same one).
    sleep "0.$(printf '%03d' $((RANDOM % interval_ms)))"
    t0=$(now)
    json=$(bf_ctl B acquire db --json --timeout 30s 2>&1)
    rc=$?
    t1=$(now)
    if ((rc != 0)); then
      problem "B's acquire ($preempt, $n LUs) exited $rc: $json"
      continue
    fi
    b_held=1
    key=$(grep -o -m1 '"key": *"0x[0-9a-f]*"' <<<"$json" | grep -o '0x[0-9a-f]*')
    daemon_s=$(grep -o -m1 '"elapsed_ms": *[0-9.e+-]*' <<<"$json" | awk -F': *' '{printf "%.4f", $2 / 1000}')
    verified=no
    only_holder "$key" && verified=yes
    emit "$action" blkfencectl "$n" "$(since "$t0" "$t1")" "$verified"
    if [[ -n $daemon_s ]]; then
      emit "$action" blkfenced "$n" "$daemon_s" "$verified"
    else
      problem "no elapsed_ms in B's acquire reply: $json"
    fi
    if t2=$(fenced_at "$watch" "$t0"); then
      verified=no
      [[ $(bd_field A state) == fenced && $(bd_field A fenced_by) == "$key" ]] && verified=yes
      emit "$detect" from-issue "$n" "$(since "$t0" "$t2")" "$verified"
      emit "$detect" from-return "$n" "$(since "$t1" "$t2")" "$verified"
      # B's daemon logs "acquired with KEY" with its wall-clock time when the operation ends;
      # it began elapsed_ms earlier. A's daemon logs "gate closed" when it closes its gate.
      b_end=$(log_stamp "$BF/B/log" "acquired with $key" 0)
      a_gate=$(log_stamp "$BF/A/log" "] gate closed" "$t0")
      if [[ -n $b_end && -n $daemon_s ]]; then
        b_start=$(awk -v e="$b_end" -v d="$daemon_s" 'BEGIN {printf "%.6f", e - d}')
        emit "$detect" from-daemon-start "$n" "$(since "$b_start" "$t2")" "$verified"
        emit "$detect" from-daemon-end "$n" "$(since "$b_end" "$t2")" "$verified"
        if [[ -n $a_gate ]]; then
          emit "$detect" gate-from-daemon-start "$n" "$(since "$b_start" "$a_gate")" "$verified"
          emit "$detect" gate-from-daemon-end "$n" "$(since "$b_end" "$a_gate")" "$verified"
        fi
      fi
    else
      problem "A reported no fenced event ($preempt, $n LUs): $(bd_field A state)"
    fi
  done
  bf_stop A; bf_stop B
  kill "$watch_pid" 2>/dev/null
  wait "$watch_pid" 2>/dev/null
  cp "$watch" "$BLKFENCE_LAB_OUT/watch-A.$preempt.$n.log" 2>/dev/null
  return 0
}

# metric NODE NAME: one sample of resource db from NODE's metrics.
metric() {
  bf_ctl "$1" metrics | awk -v name="$2{resource=\"db\"}" '$1 == name { print $2 }'
}
# ticks PID: "utime stime" of the process, in clock ticks (its threads included).
ticks() {
  local -a f
  read -r -a f <"/proc/$1/stat" || return 1
  echo "${f[13]} ${f[14]}"  # fields 14 and 15; the comm field (blkfenced) has no space
}

# cpu_run TRANSPORT N: A alone holds N LUs; its CPU over the window.
cpu_run() {
  local transport=$1 n=$2 pid u0 u1 k0 k1 t0 t1 c0 c1 s0 s1 hz seconds verified=no
  hz=$(getconf CLK_TCK)
  bd_fresh "$n"
  bd_config A 1 preempt "$n" "$transport"
  bd_start A "monitor cpu, $transport, $n LUs" || { problem "A's daemon did not start"; return 1; }
  bf_ctl A acquire db --timeout 30s >/dev/null || { problem "A's acquire for the CPU run failed"; return 1; }
  sleep 2
  pid=$(cat "$BF/A/pid")
  c0=$(metric A blkfence_check_latency_seconds_count) s0=$(metric A blkfence_check_latency_seconds_sum)
  read -r u0 k0 < <(ticks "$pid"); t0=$(now)
  sleep "$cpu_seconds"
  read -r u1 k1 < <(ticks "$pid"); t1=$(now)
  seconds=$(since "$t0" "$t1")
  c1=$(metric A blkfence_check_latency_seconds_count) s1=$(metric A blkfence_check_latency_seconds_sum)
  [[ $(bd_field A state) == held && $(bd_field A gate_open) == true ]] && verified=yes
  emit monitor-cpu "$transport" "$n" \
    "$(awk -v k="$((u1 - u0 + k1 - k0))" -v hz="$hz" -v s="$seconds" 'BEGIN {printf "%.3f", 100 * k / hz / s}')" "$verified"
  emit monitor-cpu-kernel "$transport" "$n" \
    "$(awk -v k="$((k1 - k0))" -v hz="$hz" -v s="$seconds" 'BEGIN {printf "%.3f", 100 * k / hz / s}')" "$verified"
  emit monitor-window "$transport" "$n" "$seconds" "$verified"
  emit checks-per-second "$transport" "$n" \
    "$(awk -v c="$((c1 - c0))" -v s="$seconds" 'BEGIN {printf "%.2f", c / s}')" "$verified"
  emit check-latency "$transport" "$n" \
    "$(awk -v c="$((c1 - c0))" -v a="$s0" -v b="$s1" 'BEGIN {printf "%.4f", c ? (b - a) / c : 0}')" "$verified"
  note "CPU run ($transport, $n LUs): $((u1 - u0)) user + $((k1 - k0)) system ticks at $hz/s, $((c1 - c0)) checks in $seconds s"
  bf_stop A
}

# How much slower the guest is than the host (report.py runs the same on the host): a pure
# user-space loop, and clock_gettime(), which under TCG leaves the vDSO (the guest's clocksource is
# HPET: its TSC is unstable) for a system call and an emulated HPET read.
cpu_reference() {
  emit cpu-reference python-loop 0 "$(python3 -c "$BENCH_LOOP" 2>/dev/null)" yes
  emit cpu-reference clock_gettime 0 "$(python3 -c "$BENCH_CLOCK" 2>/dev/null)" yes
}
BENCH_LOOP='import time; t = time.perf_counter(); sum(range(3000000)); print("%.4f" % (time.perf_counter() - t))'
BENCH_CLOCK='import time; c = time.clock_gettime; m = time.CLOCK_MONOTONIC; t = time.perf_counter()
for _ in range(20000): c(m)
print("%.9f" % ((time.perf_counter() - t) / 20000))'

[[ ${1:-} == --functions-only ]] && return 0
cpu_reference
largest=0
for n in $sizes; do
  ((n > largest)) && largest=$n
  bd_fresh "$n"
  raw_rt "$n"
  for preempt in preempt preempt-and-abort; do
    [[ $preempt == preempt-and-abort && $LAB_FABRIC == tcm_loop ]] && continue  # deadlocks LIO 6.1
    acquire_runs "$preempt" "$n"
  done
done
for transport in uring sgio; do
  cpu_run "$transport" "$largest"
done
bd_fresh "$largest"
((problems == 0)) || { note "$problems measurement(s) failed (above)"; exit 1; }
exit 0

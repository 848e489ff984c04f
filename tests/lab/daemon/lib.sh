# Helpers for lab checks that run blkfenced (sourced after tests/lab/lib/guest.sh; bash).
#
# Each node runs its own daemon under /tmp/bf/<node> (config, state_dir, run_dir, log), using only
# its own nexuses (the map's sg nodes of that node), talking to blkfencectl through its own socket.
# As in lib/guest.sh, every read helper here fails (with its reason on stderr) when it cannot read,
# and checks use lab_expect_read: a daemon that does not answer is never "no key" or "0 rounds".
set -o pipefail

BF=/tmp/bf
: "${BLKFENCED:?BLKFENCED must name the blkfenced binary (tests/lab/CMakeLists.txt passes it)}"
: "${BLKFENCECTL:?BLKFENCECTL must name the blkfencectl binary}"

# The daemons' logs go out with the job's results, whatever happens.
bf_save_logs() {
  local node saved=()
  for node in A B; do
    [[ -f $BF/$node/log ]] && cp "$BF/$node/log" "$BLKFENCE_LAB_OUT/blkfenced-$node.log" &&
      saved+=("blkfenced-$node.log")
  done
  if ((${lab_checks_failed:-0} > 0 && ${#saved[@]} > 0)); then
    echo "lab: the daemons' logs are in the lab's out directory: ${saved[*]}"
  fi
  return 0
}
trap bf_save_logs EXIT
# ... and when the watchdog ends the check (member.sh sources this without tests/lab/lib/guest.sh).
declare -F lab_keep_logs >/dev/null && lab_keep_logs "$BF" blkfenced

# bf_ctl NODE ARGS...: blkfencectl against NODE's daemon.
bf_ctl() { local node=$1; shift; BLKFENCE_SOCKET=$BF/$node/run/control.sock "$BLKFENCECTL" "$@"; }

# bf_config NODE NODE_ID PREEMPT "DB_LUS" "SHARED_LUS" [CHECK_INTERVAL LEASE]: NODE's configuration:
# resource "db" (exclusive) on DB_LUS and "logs" (shared) on SHARED_LUS, by NODE's sg paths.
bf_config() {
  local node=$1 id=$2 preempt=$3 db_lus=$4 shared_lus=$5 interval=${6:-500ms} lease=${7:-3s}
  local dir=$BF/$node devices lu
  mkdir -p "$dir/state" "$dir/run"
  devices=""
  for lu in $db_lus; do devices+="\"$(lab_dev "$node" "$lu" sg)\", "; done
  cat >"$dir/blkfence.toml" <<TOML
cluster = "lab"
node_id = $id
state_dir = "$dir/state"
run_dir = "$dir/run"

[[resource]]
name = "db"
devices = [${devices%, }]
preempt = "$preempt"
check_interval = "$interval"
lease = "$lease"
command_timeout = "2s"
on_fenced = ["/bin/sh", "-c", "echo \$BLKFENCE_REASON \$BLKFENCE_KEY >> $dir/on_fenced"]
TOML
  if [[ -n $shared_lus ]]; then
    devices=""
    for lu in $shared_lus; do devices+="\"$(lab_dev "$node" "$lu" sg)\", "; done
    cat >>"$dir/blkfence.toml" <<TOML

[[resource]]
name = "logs"
devices = [${devices%, }]
mode = "shared"
preempt = "$preempt"
check_interval = "$interval"
lease = "$lease"
command_timeout = "2s"
on_fenced = "none"
TOML
  fi
}

# bf_start NODE [BINARY]: starts NODE's daemon and waits until every resource's state is known.
bf_start() {
  local node=$1 binary=${2:-$BLKFENCED} try status
  "$binary" --config "$BF/$node/blkfence.toml" --log stderr >>"$BF/$node/log" 2>&1 &
  echo $! >"$BF/$node/pid"
  for ((try = 0; try < 200; try++)); do
    # Captured, then matched: under pipefail `bf_ctl | grep -q` fails when grep exits first.
    if status=$(bf_ctl "$node" status --json 2>/dev/null) &&
      [[ $status == *'"state"'* && $status != *'"state": "unknown"'* ]]; then
      return 0
    fi
    kill -0 "$(cat "$BF/$node/pid")" 2>/dev/null || { echo "blkfenced $node died:"; tail -5 "$BF/$node/log"; return 1; }
    sleep 0.1
  done
  echo "blkfenced $node did not become ready"; tail -5 "$BF/$node/log"
  return 1
}

# bf_alive PID: the process exists and has not exited (a zombie waiting for its parent has).
bf_alive() {
  local state
  read -r _ _ state _ 2>/dev/null <"/proc/$1/stat" && [[ $state != Z ]]
}

# bf_stop NODE: SIGTERM, then wait until the process is gone (SIGKILL after 10 s). A daemon that
# bf_start started inside $(...) (lab_expect does) is not this shell's child, so `wait` alone
# would return at once, with the daemon still running.
bf_stop() {
  local pid try
  pid=$(cat "$BF/$1/pid") || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((try = 0; try < 100; try++)); do
    bf_alive "$pid" || break
    sleep 0.1
  done
  if bf_alive "$pid"; then
    echo "bf_stop: blkfenced $1 (pid $pid) still runs 10 s after SIGTERM; killing it" >&2
    kill -KILL "$pid" 2>/dev/null
    for ((try = 0; try < 50; try++)); do
      bf_alive "$pid" || break
      sleep 0.1
    done
  fi
  wait "$pid" 2>/dev/null
  return 0
}

# bf_field NODE RESOURCE FIELD: one field of the resource's status (state, gate_open, key, epoch,
# fenced_by), as blkfencectl status --json prints it.
bf_field() {
  bf_ctl "$1" status "$2" --json | python3 -c '
import json, sys
status = json.load(sys.stdin)["resources"][0]
value = status.get(sys.argv[1])
print("null" if value is None else (str(value).lower() if isinstance(value, bool) else value))' "$3"
}

# bf_await NODE RESOURCE FIELD VALUE [TRIES]: waits (polling status) until FIELD is VALUE.
bf_await() {
  local node=$1 resource=$2 field=$3 want=$4 tries=${5:-150} got try
  for ((try = 0; try < tries; try++)); do
    got=$(bf_field "$node" "$resource" "$field" 2>/dev/null)
    [[ $got == "$want" ]] && return 0
    sleep 0.1
  done
  echo "bf_await: $node $resource $field is '$got', not '$want'"
  return 1
}

# bf_await_log NODE TEXT [TRIES]: waits until NODE's daemon log holds TEXT.
bf_await_log() {
  local node=$1 text=$2 tries=${3:-100} try
  for ((try = 0; try < tries; try++)); do
    grep -qF -- "$text" "$BF/$node/log" && return 0
    sleep 0.1
  done
  echo "bf_await_log: '$text' is not in $BF/$node/log"
  return 1
}

# bf_await_file_line PATH LINE: waits (10 s at most) until PATH holds LINE, whole.
bf_await_file_line() {
  local try
  for ((try = 0; try < 100; try++)); do
    grep -qxF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "bf_await_file_line: no line '$2' in $1"
  return 1
}

# bf_await_file PATH: waits (5 s at most) until PATH exists.
bf_await_file() {
  local try
  for ((try = 0; try < 50; try++)); do
    [[ -e $1 ]] && return 0
    sleep 0.1
  done
  echo "bf_await_file: no $1"
  return 1
}

# bf_await_pings LOG SINCE COUNT: waits (10 s at most) until LOG (notify_listener.py's) holds COUNT
# WATCHDOG=1 lines stamped after SINCE (an EPOCHREALTIME).
bf_await_pings() {
  local log=$1 since=$2 want=$3 got=0 try
  for ((try = 0; try < 100; try++)); do
    got=$(awk -v t="$since" '$1 > t && $2 == "WATCHDOG=1"' "$log" | wc -l)
    ((got >= want)) && return 0
    sleep 0.1
  done
  echo "bf_await_pings: $got WATCHDOG=1 after $since in $log, wanted $want"
  return 1
}

# bf_metric NODE SAMPLE: the value of one sample of NODE's metrics, e.g.
# 'blkfence_strays_preempted_total{resource="db"}'. Fails when the metrics cannot be read or do not
# hold the sample, or its value is not a number: a metric that cannot be read is not 0.
bf_metric() {
  local metrics
  metrics=$(bf_ctl "$1" metrics) || { echo "bf_metric: blkfencectl metrics on $1 failed (exit $?)" >&2; return 1; }
  awk -v sample="$2" -v node="$1" '
    $1 == sample && $2 ~ /^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ { print $2; found = 1; exit }
    END { if (!found) { printf "bf_metric: %s has no sample %s\n", node, sample > "/dev/stderr"; exit 1 } }' <<<"$metrics"
}

# bf_checks NODE RESOURCE: how many monitor rounds the daemon has finished (its metrics).
bf_checks() { bf_metric "$1" "blkfence_check_latency_seconds_count{resource=\"$2\"}"; }

# bf_await_checks NODE RESOURCE N: waits until N more monitor rounds have finished. Fails at once
# when the count cannot be read (the daemon is gone), with the reason.
bf_await_checks() {
  local start now try
  start=$(bf_checks "$1" "$2") || { echo "bf_await_checks: cannot read $1's rounds of $2"; return 1; }
  for ((try = 0; try < 300; try++)); do
    now=$(bf_checks "$1" "$2") || { echo "bf_await_checks: cannot read $1's rounds of $2"; return 1; }
    ((now >= start + $3)) && return 0
    sleep 0.1
  done
  echo "bf_await_checks: $1 $2 did not finish $3 more checks ($start, then $now)"
  return 1
}

# bf_clear [--via NODE] LU...: removes every registration and reservation (through NODE's path,
# node A's by default); fails when a LU could not be cleared.
bf_clear() {
  local lu dev rc=0 node=A
  [[ ${1:-} == --via ]] && { node=$2; shift 2; }
  for lu in "$@"; do
    if ! dev=$(lab_dev "$node" "$lu" sg) ||
      ! lab_pr --out --register-ignore --param-sark=0x1 "$dev" >/dev/null 2>&1 ||
      ! lab_pr --out --clear --param-rk=0x1 "$dev" >/dev/null 2>&1; then
      echo "bf_clear: clearing LU $lu failed" >&2
      rc=1
    fi
  done
  return "$rc"
}

# bf_holders_everywhere LU...: the holder keys of every LU (read through node B; "none" for a LU
# without a reservation), sorted and unique, each followed by a space. Fails when any LU cannot be
# read: an unreadable LU does not drop out of the answer.
bf_holders_everywhere() {
  local lu dev holder all=""
  for lu in "$@"; do
    dev=$(lab_dev B "$lu") || { echo "bf_holders_everywhere: LU $lu is not in the map" >&2; return 1; }
    holder=$(lab_holder_key "$dev") || { echo "bf_holders_everywhere: LU $lu ($dev) cannot be read" >&2; return 1; }
    all+=$holder$'\n'
  done
  [[ -z $all ]] || printf '%s' "$all" | sort -u | tr '\n' ' '
}

# bf_ptpl_active_everywhere LU...: PTPL_A (APTPL active) of every LU from REPORT CAPABILITIES (read
# through node B), sorted and unique, each followed by a space. Fails when any LU cannot be read.
bf_ptpl_active_everywhere() {
  local lu dev out all=""
  for lu in "$@"; do
    dev=$(lab_dev B "$lu") || { echo "bf_ptpl_active_everywhere: LU $lu is not in the map" >&2; return 1; }
    out=$(lab_pr --in --report-capabilities "$dev") &&
      [[ $out =~ PTPL_A\):\ ([01]) ]] ||
      { echo "bf_ptpl_active_everywhere: LU $lu ($dev) cannot be read: $out" >&2; return 1; }
    all+=${BASH_REMATCH[1]}$'\n'
  done
  [[ -z $all ]] || printf '%s' "$all" | sort -u | tr '\n' ' '
}

# bf_keys_everywhere LU...: the registered keys of every LU (read through node B), sorted and unique,
# each followed by a space ("" when no LU has one). Fails when any LU cannot be read: an unreadable
# LU is not one without keys.
bf_keys_everywhere() {
  local lu dev keys all=""
  for lu in "$@"; do
    dev=$(lab_dev B "$lu") || { echo "bf_keys_everywhere: LU $lu is not in the map" >&2; return 1; }
    keys=$(lab_keys "$dev") || { echo "bf_keys_everywhere: LU $lu ($dev) cannot be read" >&2; return 1; }
    [[ -z $keys ]] || all+=$keys$'\n'
  done
  [[ -z $all ]] || printf '%s' "$all" | sort -u | tr '\n' ' '
}

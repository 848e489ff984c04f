#!/bin/bash
# blkfenced end to end on real LIO (issue 4; docs/protocol.md, docs/design.md §5): two daemons, node A and node B, each
# using only its own nexuses, in one boot:
#   1. failover: A acquires (its REGISTERs set APTPL: PTPL_A is on where the clear left it off);
#      a writer under `blkfencectl run` on A writes records stamped with A's epoch; A is frozen
#      whole (SIGSTOP: daemon, run, writer); B acquires (preempts A); the writer is
#      resumed and its next write is refused by the target (EBADE); A's daemon is resumed and
#      reports fenced within one check_interval plus a round trip, removes the token, runs
#      on_fenced, and `run` kills the writer; no record of A's epoch written after B's acquisition
#      is on the LU (S1); A never registers again on its own (S5);
#   2. restarts: A's daemon restarted after the fence does not register (S5); B's daemon restarted
#      while holding adopts its verified key, and the epoch never goes back (S3); B's daemon lives
#      on through SIGHUP, and a second daemon on its run_dir refuses to start;
#   3. B releases: its gate closes, its key keeps the reservation (a LU must never be left without
#      one), and its restarted daemon does not adopt it; then A acquires from the released holder
#      and ends as the only holder with the only open gate (racing acquires are left to the
#      simulation and `stress/race_acquires.sh`: they can wedge LIO, see tests/lab/README.md);
#      then A's daemon is stopped for longer than the lease: the writer under `run` dies;
#   4. shared mode: A and B unfenced, A fences B, B's writes are refused and A's succeed; A, the
#      last member, releases: its paths move to its departed key, the LU stays reserved under
#      Write Exclusive, all registrants, and B's writes are still refused;
#   5. (iSCSI) the storage becomes unreachable (A's session is logged out): A's gate closes after
#      the lease, and A's daemon, restarted with a watchdog, goes on feeding it (no restart loop);
#      restarted while its LUs are gone, A's daemon waits for them and adopts its key once the
#      session logs in again.
# With "mutant", A runs blkfenced_mutant_reregister (re-registers after a fence) and the check
# passes only if step 1's S5 check catches it: A's key back on the LUs (B's daemon is stopped
# before A resumes, so that no preempt meets the mutant's re-registrations; see below).
#   usage: e2e.sh PREEMPT DB_LUS SHARED_LU [mutant]    e.g. e2e.sh preempt-and-abort 0,1 2
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
preempt=$1 db_lus=${2//,/ } shared_lu=$3 mode=${4:-}
interval_ms=500
first_lu=${db_lus%% *}
a_dev=$(lab_dev A "$first_lu") b_dev=$(lab_dev B "$first_lu")
block0=1000

rm -rf "$BF"
lab_expect "the LUs are cleared first" bf_clear $db_lus $shared_lu
# Records of an earlier run in this boot must not pass for this run's.
dd if=/dev/zero of="$a_dev" bs=4096 seek="$block0" count=600 oflag=direct status=none
bf_config A 1 "$preempt" "$db_lus" "$shared_lu" "${interval_ms}ms" 3s
bf_config B 2 "$preempt" "$db_lus" "$shared_lu" "${interval_ms}ms" 3s
a_binary=$BLKFENCED
[[ $mode == mutant ]] && a_binary=${BLKFENCED_MUTANT:?BLKFENCED_MUTANT names blkfenced_mutant_reregister}
lab_expect_read "APTPL is off on every LU after the clear (its REGISTER had APTPL=0)" "0 " bf_ptpl_active_everywhere $db_lus
lab_expect "A's daemon starts" bf_start A "$a_binary"
lab_expect "B's daemon starts" bf_start B
lab_expect_read "A's gate is closed at start" false bf_field A db gate_open
lab_expect_eq "no token file on A (only its socket and lock)" "$(ls "$BF/A/run")" "$(printf "blkfenced.lock\ncontrol.sock")"

# --- 1. failover ---------------------------------------------------------------------------------
lab_expect "A acquires db" bf_ctl A acquire db --timeout 30s
key_a=$(bf_field A db key) epoch_a=$(bf_field A db epoch)
lab_log "A holds with $key_a (epoch $epoch_a)"
lab_expect "A's status names its key ('$key_a')" lab_is_key "$key_a"
lab_expect_key "A's token file holds its key" "$key_a" cat "$BF/A/run/db.token"
lab_expect_read "A's key is the only key on every LU (read by B)" "$key_a " bf_keys_everywhere $db_lus
lab_expect_key "A holds LU $first_lu (read by B)" "$key_a" lab_holder_key "$b_dev"
lab_expect_read "APTPL is active on every LU: A's REGISTERs set it (LIO reports PTPL_C)" "1 " bf_ptpl_active_everywhere $db_lus
lab_expect_eq "gate check on A says open" "$(bf_ctl A gate check db >/dev/null 2>&1; echo $?)" 0
lab_expect_eq "gate check on B says closed" "$(bf_ctl B gate check db >/dev/null 2>&1; echo $?)" 1

bf_ctl A run db -- "$BLKFENCE_LAB_REPO/tests/lab/daemon/writer.sh" A "$a_dev" "$block0" "$BF/A/writer.log" \
  >"$BF/A/run.out" 2>&1 &
run_pid=$!
for ((try = 0; try < 200; try++)); do
  grep -q '^ok 3$' "$BF/A/writer.log" 2>/dev/null && break
  sleep 0.1
done
lab_expect "A's writer lands writes while A holds" grep -q '^ok 3$' "$BF/A/writer.log"
writer_pid=$(cat "$BF/A/writer.log.pid")
a_pid=$(cat "$BF/A/pid")
# A freezes whole: its daemon, its blkfencectl run (which would otherwise kill the writer a lease
# after the daemon stopped answering) and the writer.
kill -STOP "$a_pid"
# blkfencectl itself: $run_pid is the subshell that bf_ctl runs in; the writer's parent is it.
run_ctl=$(awk '{ print $4 }' "/proc/$writer_pid/stat")
kill -STOP "$run_ctl"
kill -STOP -- "-$writer_pid"
last_issued=$(awk '$1 == "issue" { n = $2 } END { print n }' "$BF/A/writer.log")
lab_log "froze A's daemon and writer (last write issued: $last_issued)"

t_acquire=$EPOCHREALTIME
bf_ctl B acquire db --timeout 30s --json >"$BF/B/acquire.json"
lab_expect_eq "B acquires db while A is frozen" "$?" 0
key_b=$(bf_field B db key) epoch_b=$(bf_field B db epoch)
lab_expect "B's status names its key ('$key_b')" lab_is_key "$key_b"
lab_log "B holds with $key_b (epoch $epoch_b) after $(awk -v a="$t_acquire" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }') s (in the daemon: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["elapsed_ms"])' "$BF/B/acquire.json") ms)"
lab_expect "B's epoch is above A's" test "$epoch_b" -gt "$epoch_a"
lab_expect_read "B's key is the only key on every LU" "$key_b " bf_keys_everywhere $db_lus
lab_expect "B writes" lab_write "$b_dev" "$block0" "blkfence-lab node=B epoch=$epoch_b marker"

kill -CONT -- "-$writer_pid"
for ((try = 0; try < 100; try++)); do
  grep -q '^fail' "$BF/A/writer.log" && break
  sleep 0.1
done
lab_expect_eq "the target refuses A's next write" \
  "$(awk '$1 == "fail" { $1 = ""; $2 = ""; sub(/^ +/, ""); print; exit }' "$BF/A/writer.log")" "Invalid exchange"

if [[ $mode == mutant ]]; then
  # The mutant re-registers A's key after the fence (S5): the key on the LUs catches it. Nothing
  # may preempt that key meanwhile: B's monitor would (a stray ranking below B's key), and a
  # PREEMPT that meets A's next re-registration in the target is LIO's PR OUT deadlock
  # (tests/lab/README.md, "Limits"), which a broken node driven this way hits within minutes. So
  # B's daemon stops first; its key stays the holder, and A's re-registrations meet no preempt.
  # Caught means A's key (a real key: an empty one would match any answer) read back on a LU; a
  # read that fails ends the wait as a failed check, never as "not back yet".
  bf_stop B
  kill -CONT "$a_pid"
  caught=no keys=""
  lab_is_key "$key_a" || caught="no key of A's to look for ('$key_a')"
  for ((try = 0; try < 50; try++)); do
    [[ $caught == no ]] || break
    lab_capture keys bf_keys_everywhere $db_lus || { caught=$keys; break; }
    [[ " $keys" == *" $key_a "* ]] && { caught=yes; break; }
    sleep 0.1
  done
  bf_stop A
  kill -KILL -- "-$writer_pid" "$run_ctl" "$run_pid" 2>/dev/null
  wait "$run_pid" 2>/dev/null
  lab_log "mutant: A's key back on the LUs: $caught"
  lab_expect_eq "the mutant is caught by S5 (A's key came back on the LUs after the fence)" "$caught" yes
  lab_expect "the LUs are cleared" bf_clear $db_lus $shared_lu
  lab_done
  exit
fi
t_resume=$EPOCHREALTIME
kill -CONT "$a_pid"
lab_expect "A's daemon reports fenced" bf_await A db state fenced
lab_expect_read "S5: A's key was not on any LU at the fence" "$key_b " bf_keys_everywhere $db_lus
# When A's daemon decided: its log line (stamped with CLOCK_REALTIME, like EPOCHREALTIME). The
# round that saw the fence took the monitor's own round-trip time (its metrics).
t_fenced=$(awk '/ db: fenced: / { gsub(/^<[0-9]>\[|\].*$/, ""); print; exit }' "$BF/A/log")
rtt_ms=$(bf_metric A 'blkfence_check_latency_seconds_max{resource="db"}' | awk '{ printf "%d", $1 * 1000 + 0.5 }')
if [[ -n $t_fenced && -n $rtt_ms ]]; then
  detection_ms=$(awk -v a="$t_resume" -v b="$t_fenced" 'BEGIN { printf "%d", (b - a) * 1000 }')
  lab_log "detection: A reported fenced $detection_ms ms after it resumed (check_interval $interval_ms ms, slowest round trip $rtt_ms ms)"
  lab_expect "A detects within check_interval + a round trip" \
    test "$detection_ms" -le $((interval_ms + rtt_ms))
else
  lab_not_ok "no fenced event in A's watch, or no round-trip metric ('$t_fenced' '$rtt_ms')"
fi
lab_expect_key "A reports B's key as the one that fenced it" "$key_b" bf_field A db fenced_by
lab_expect_read "A's gate is closed" false bf_field A db gate_open
lab_expect "A's token file is gone" test ! -e "$BF/A/run/db.token"
# blkfencectl run resumes last: the fenced event waits in its socket and is the first thing it reads.
kill -CONT "$run_ctl"
for ((try = 0; try < 100; try++)); do kill -0 "$run_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$run_pid" 2>/dev/null; then
  lab_not_ok "blkfencectl run is still running 10 s after the fence"
  kill -KILL -- "-$writer_pid" "$run_ctl" "$run_pid" 2>/dev/null
fi
wait "$run_pid"
lab_expect_eq "blkfencectl run killed the writer and exited 4" "$?" 4
lab_expect "the writer is gone" test ! -d "/proc/$writer_pid"
lab_expect "on_fenced ran with the reason and A's key" grep -qx "fenced $key_a" "$BF/A/on_fenced"

# S5: A does not register again, over several of its monitor rounds.
lab_expect "A's daemon finishes 4 more monitor rounds" bf_await_checks A db 4
lab_expect_read "S5: A's key stays off every LU" "$key_b " bf_keys_everywhere $db_lus
lab_expect_read "S5: B never had to preempt a key of A's" 0 bf_metric B 'blkfence_strays_preempted_total{resource="db"}'
# A straggler: a write from A's nexus with A's old epoch, as a writer that the gate did not stop in
# time would issue. The target must refuse it, since A's key stays unregistered (S5 => S1).
straggler=$(lab_write "$a_dev" $((block0 + last_issued + 40)) "blkfence-lab node=A epoch=$epoch_a seq=straggler") &&
  straggler="the write landed"

# S1: nothing of A's epoch issued after the freeze is on the LU (read through B's nexus). A block
# that cannot be read is not one without A's record: it fails the check.
landed_after="" record=""
for ((seq = last_issued + 1; seq <= last_issued + 50; seq++)); do
  lab_capture record lab_read "$b_dev" $((block0 + seq)) || { landed_after+=" $seq($record)"; continue; }
  [[ $record == *"node=A epoch=$epoch_a"* ]] && landed_after+=" $seq"
done
lab_expect_read "S1: B still reads its marker" "blkfence-lab node=B epoch=$epoch_b marker" lab_read "$b_dev" "$block0"
lab_expect_eq "the target refuses A's straggler write" "$straggler" "Invalid exchange"
lab_expect_eq "S1: no record of A's epoch landed after the freeze${landed_after:+ (landed:$landed_after)}" "${landed_after:-none}" none

# --- 2. restarts ---------------------------------------------------------------------------------
bf_stop A
lab_expect "A's daemon restarts" bf_start A
lab_expect_read "restarted A is released, not holding" released bf_field A db state
lab_expect_read "S5: restarted A registered nothing" "$key_b " bf_keys_everywhere $db_lus
# RESOURCE.epoch is "USED SEEN" (SEEN: the highest epoch of the cluster the node has read; the file
# holds one number when both are the same): A used epoch_a and saw B's.
lab_expect_eq "S3: A's persisted epochs are $epoch_a used, $epoch_b seen" "$(cat "$BF/A/state/db.epoch")" "$epoch_a $epoch_b"
bf_stop B
lab_expect "B's daemon restarts" bf_start B
lab_expect_key "restarted B adopts its verified key" "$key_b" bf_field B db key
lab_expect_read "restarted B's gate is open" true bf_field B db gate_open
lab_expect_key "restarted B's token file" "$key_b" cat "$BF/B/run/db.token"
# SIGHUP is logged and ignored (it used to end the daemon); a second daemon on B's run_dir refuses
# to start (run_dir/blkfenced.lock) and leaves the first one serving. `timeout`: a second daemon
# that did start would run until killed, failing the check.
b_pid=$(cat "$BF/B/pid")
kill -HUP "$b_pid"
lab_expect "B's daemon logs SIGHUP as ignored" bf_await_log B "SIGHUP ignored"
lab_expect "B's daemon lives on after SIGHUP" bf_alive "$b_pid"
second=$(timeout 20 "$BLKFENCED" --config "$BF/B/blkfence.toml" --log stderr 2>&1)
lab_expect_eq "a second blkfenced on B's run_dir exits 1" "$?" 1
lab_expect "... naming the running one (pid $b_pid)" grep -q "another blkfenced (pid $b_pid) already runs" <<<"$second"
lab_expect_key "B's first daemon still serves, holding with its key" "$key_b" bf_field B db key
lab_expect_key "... and B's token file is still there" "$key_b" cat "$BF/B/run/db.token"

# --- 3. racing acquires --------------------------------------------------------------------------
lab_expect "B releases db" bf_ctl B release db --timeout 30s
lab_expect_read "released B's gate is closed" false bf_field B db gate_open
lab_expect "released B's token file is gone" test ! -e "$BF/B/run/db.token"
# The reservation is not dropped: a LU without one would let any nexus write (docs/protocol.md).
lab_expect_read "B's released key still holds every LU" "$key_b " bf_holders_everywhere $db_lus
lab_expect_read "... and is the only key" "$key_b " bf_keys_everywhere $db_lus
lab_expect_eq "S3: B's persisted epoch moved one past it" "$(awk '{ print $1 }' "$BF/B/state/db.epoch")" "$((epoch_b + 1))"
bf_stop B
lab_expect "B's daemon restarts after the release" bf_start B
lab_expect_eq "restarted B does not adopt its released key" "$(bf_field B db state)/$(bf_field B db gate_open)" released/false
# A takes over from the released holder: its acquire preempts B's key, which no node holds open.
# (Two nodes acquiring at the same moment make their PR OUTs meet in the target, which can wedge
# LIO on 6.1: tests/lab/README.md, "Limits". The simulation races acquires: tests/sim.)
lab_expect "A acquires db from the released holder" bf_ctl A acquire db --timeout 30s
key_a2=$(bf_field A db key)
lab_expect_key "A's new key holds every LU" "$key_a2" lab_holder_key "$a_dev"
lab_expect_read "A's new key is the only key on every LU" "$key_a2 " bf_keys_everywhere $db_lus
lab_expect_read "A's gate is open" true bf_field A db gate_open
lab_expect_read "B's gate stays closed" false bf_field B db gate_open
lab_expect_eq "exactly one token file: A's" "$(ls "$BF"/A/run/db.token "$BF"/B/run/db.token 2>/dev/null)" "$BF/A/run/db.token"
lab_expect "S3: A's epoch is above every earlier one" test "$(bf_field A db epoch)" -gt "$epoch_b"
# A daemon stopped for longer than the lease (SIGSTOP: it sends nothing and its socket stays open):
# the writer under blkfencectl run dies once a lease passes without the gate confirmed.
bf_ctl A run db -- "$BLKFENCE_LAB_REPO/tests/lab/daemon/writer.sh" A "$a_dev" 2000 "$BF/A/writer2.log" \
  >"$BF/A/run2.out" 2>&1 &
run2_pid=$!
lab_expect "A's writer under run lands a write" bf_await_file_line "$BF/A/writer2.log" "ok 1"
writer2_pid=$(cat "$BF/A/writer2.log.pid")
kill -STOP "$(cat "$BF/A/pid")"
t_stop=$EPOCHREALTIME
for ((try = 0; try < 100; try++)); do kill -0 "$run2_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$run2_pid" 2>/dev/null; then
  lab_not_ok "blkfencectl run still runs 10 s after A's daemon stopped"
  kill -KILL -- "-$writer2_pid" 2>/dev/null
fi
wait "$run2_pid"
lab_expect_eq "with A's daemon stopped, blkfencectl run killed the writer and exited 6" "$?" 6
lab_log "run ended $(awk -v a="$t_stop" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }') ms after A's daemon stopped (lease 3000 ms): $(tail -1 "$BF/A/run2.out")"
lab_expect "the writer is gone" test ! -d "/proc/$writer2_pid"
kill -CONT "$(cat "$BF/A/pid")"
lab_expect "A's daemon, resumed, holds with its gate open (a check within the lease)" bf_await A db gate_open true

# --- 4. shared mode ------------------------------------------------------------------------------
if [[ -n $shared_lu ]]; then
  a_log=$(lab_dev A "$shared_lu") b_log=$(lab_dev B "$shared_lu")
  lab_expect "A unfences logs" bf_ctl A unfence logs --timeout 30s
  lab_expect "B unfences logs" bf_ctl B unfence logs --timeout 30s
  lab_expect_eq "both gates of logs are open" "$(bf_field A logs gate_open) $(bf_field B logs gate_open)" "true true"
  lab_expect "B writes to logs while unfenced" lab_write "$b_log" 0 "B before the fence"
  lab_expect "A fences node 2" bf_ctl A fence logs --node 2 --timeout 30s
  error=$(lab_write "$b_log" 1 "B after the fence") && error="the write succeeded"
  lab_expect_eq "the target refuses B's write" "$error" "Invalid exchange"
  lab_expect "A still writes" lab_write "$a_log" 2 "A after the fence"
  lab_expect "B's daemon reports fenced on logs" bf_await B logs state fenced
  lab_expect_read "B's logs gate is closed" false bf_field B logs gate_open
  # The last member leaves: a RELEASE or an unregister would leave the LU unreserved, and B's
  # stale writes would land (docs/protocol.md, "Shared mode").
  key_logs_a=$(bf_field A logs key)
  departed_a=${key_logs_a%????????}00000001
  paths_a=$(lab_keys "$a_log" | grep -cx "$key_logs_a")
  lab_expect "A's key is registered on logs" test "$paths_a" -ge 1
  lab_expect "A, the last member, releases logs" bf_ctl A release logs --timeout 30s
  lab_expect_read "A's $paths_a path(s) to logs carry its departed key $departed_a, and only they" \
    "$(for ((i = 0; i < paths_a; i++)); do printf '%s ' "$departed_a"; done)" lab_keyset "$a_log"
  lab_expect "logs is still reserved, Write Exclusive, all registrants" \
    grep -q "all registrants" <<<"$(lab_holder "$a_log")"
  error=$(lab_write "$b_log" 3 "B after the last release") && error="the write succeeded"
  lab_expect_eq "the target still refuses B's write" "$error" "Invalid exchange"
  lab_expect_eq "B's write is not on the LU" "$(lab_read "$a_log" 3)" ""
fi

# --- 5. storage unreachable (iSCSI) --------------------------------------------------------------
if [[ $LAB_FABRIC == iscsi ]]; then
  # A's daemon again, now with a systemd-style watchdog (2 s): it must go on proving its loop alive
  # while its storage is gone; a restart would not bring the storage back (systemd/README.md).
  bf_stop A
  python3 "$BLKFENCE_LAB_REPO/tests/lab/daemon/notify_listener.py" "$BF/A/notify.sock" "$BF/A/notify.log" &
  listener=$!
  lab_expect "A's notify socket is up" bf_await_file "$BF/A/notify.sock"
  NOTIFY_SOCKET=$BF/A/notify.sock WATCHDOG_USEC=2000000 bf_start A
  lab_expect_key "restarted A adopts its key" "$key_a2" bf_field A db key
  iscsiadm -m node -T "$lab_iscsi_target" -p 127.0.0.1:3260 -I lab-a --logout >/dev/null 2>&1
  t_drop=$EPOCHREALTIME
  lab_expect "A loses contact after the lease" bf_await A db state lost-contact 100
  t_lost=$(awk '/ db: lost-contact: / { gsub(/^<[0-9]>\[|\].*$/, ""); t = $0 } END { print t }' "$BF/A/log")
  lost_ms=$(awk -v a="$t_drop" -v b="$t_lost" 'BEGIN { printf "%d", (b - a) * 1000 }')
  lab_log "A's daemon closed the gate $lost_ms ms after iscsiadm logged A out (lease 3000 ms)"
  # The lease runs from the last round that read every LU, issued at most one check_interval (plus
  # its round trip) before the session went; a round in flight then ends only at command_timeout.
  lab_expect "the gate closes about one lease after contact is lost" \
    test "$lost_ms" -ge $((3000 - interval_ms - 1000)) -a "$lost_ms" -le $((3000 + 2000))
  lab_expect_read "A's gate is closed" false bf_field A db gate_open
  lab_expect "A's token file is gone" test ! -e "$BF/A/run/db.token"
  # Pings after the gate closed: the loop is alive, so the watchdog is fed (one every 0.5 s).
  lab_expect "A's daemon feeds the watchdog with its storage gone (3 pings after lost-contact)" \
    bf_await_pings "$BF/A/notify.log" "$t_lost" 3
  lab_log "watchdog pings from A after lost-contact: $(awk -v t="$t_lost" '$1 > t && $2 == "WATCHDOG=1"' "$BF/A/notify.log" | wc -l)"
  lab_expect "A's daemon is alive" bf_alive "$(cat "$BF/A/pid")"
  kill "$listener" 2>/dev/null
  # A LU missing when the daemon starts (a session not logged in yet, as at boot) is a resource
  # waiting for its devices, not a daemon that refuses to start; the login brings it in. The sg
  # nodes come back with their numbers: the kernel gives A's LUs, scanned in LUN order, the lowest
  # free minors, which are the ones they had.
  bf_stop A
  "$BLKFENCED" --config "$BF/A/blkfence.toml" --log stderr >>"$BF/A/log" 2>&1 &
  echo $! >"$BF/A/pid"
  lab_expect "A's daemon starts without its LUs: db waits for its devices" bf_await_log A "resource db waits for its devices"
  lab_expect_eq "A's db is unknown with its gate closed" "$(bf_field A db state)/$(bf_field A db gate_open)" unknown/false
  lab_expect "... and its status says what it waits for" grep -q "waiting for its devices: /dev/sg" <<<"$(bf_field A db detail)"
  error=$(bf_ctl A acquire db --timeout 10s 2>&1) && error="the acquire succeeded"
  lab_expect "an acquire of the waiting db is refused, saying why" grep -q "db waits for its devices" <<<"$error"
  t_login=$EPOCHREALTIME
  iscsiadm -m node -T "$lab_iscsi_target" -p 127.0.0.1:3260 -I lab-a --login >/dev/null
  lab_expect "once A's session is back, db resolves and A adopts its key" bf_await A db key "$key_a2" 300
  lab_log "A's db resolved and adopted $(awk -v a="$t_login" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }') ms after the login began"
  lab_expect_read "A's gate is open again" true bf_field A db gate_open
  lab_expect_key "A's key holds LU $first_lu (read through A's new path)" "$key_a2" lab_holder_key "$(lab_dev A "$first_lu" sg)"
fi

bf_stop A
bf_stop B
lab_expect "the LUs are cleared" bf_clear --via B $db_lus $shared_lu
lab_done

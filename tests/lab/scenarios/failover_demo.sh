#!/bin/bash
# The failover story with the real daemons, told as a timeline on a real LIO LU: blkfenced runs on
# node A and on node B, each through its own I_T nexus. A acquires the resource and a writer under
# `blkfencectl run` writes records stamped with A's epoch; A freezes (SIGSTOP of its daemon, its
# blkfencectl run and its writer, as in a long GC pause or a VM migration); B acquires (its daemon preempts A's key with a
# higher epoch); A's writer wakes up still believing it is the writer and the target refuses its
# next write; A's daemon wakes up, sees the fence, closes the gate and kills the writer. Ends with
# the records on the LU: none of A's was written after B's acquisition (S1).
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
a=$(lab_dev A 0) && b=$(lab_dev B 0) || { echo "LU 0 is not in the map"; exit 1; }
preempt=preempt-and-abort
[[ $LAB_FABRIC == tcm_loop ]] && preempt=preempt  # PREEMPT AND ABORT deadlocks tcm_loop on 6.1
rm -rf "$BF"
bf_clear 0 || exit 1
bf_config A 1 "$preempt" 0 "" 500ms 3s
bf_config B 2 "$preempt" 0 "" 500ms 3s
block0=100

echo "blkfence failover demo: one LU ($(lab_dev A 0 wwn)) shared by node A ($a) and node B ($b) over $LAB_FABRIC"
echo "blkfenced on each node: resource \"db\", check_interval 500 ms, lease 3 s, $preempt"
echo
bf_start A && bf_start B || exit 1
lab_log "both daemons are up; A's gate: $(bf_field A db gate_open | sed 's/false/closed/;s/true/open/')"
bf_ctl A watch db --json 2>/dev/null | while IFS= read -r line; do
  case $line in
    *'"event":"fenced"'*) lab_log "A's daemon: FENCED (the reservation is held by another key)" ;;
    *'"event":"lost-contact"'*) lab_log "A's daemon: no check succeeded for the lease (it was frozen): fail closed" ;;
    *'"event":"gate"'*'"gate_open":false'*) lab_log "A's daemon: gate closed" ;;
  esac
done &

lab_log "A: blkfencectl acquire db"
bf_ctl A acquire db --timeout 30s | sed 's/^/          /'
epoch_a=$(bf_field A db epoch)
lab_log "A's token file: $(cat "$BF/A/run/db.token")"
bf_ctl A run db -- "$BLKFENCE_LAB_REPO/tests/lab/daemon/writer.sh" A "$a" "$block0" "$BF/A/writer.log" \
  >"$BF/A/run.out" 2>&1 &
run_pid=$!
lab_log "A: blkfencectl run db -- writer.sh (records stamped with epoch $epoch_a)"
until grep -q '^ok 3$' "$BF/A/writer.log" 2>/dev/null; do sleep 0.05; done
lab_log "A's writer has landed records 1-3"

writer=$(cat "$BF/A/writer.log.pid")
kill -STOP "$(cat "$BF/A/pid")"
# blkfencectl itself: $run_pid is the subshell that bf_ctl runs in; the writer's parent is it.
run_ctl=$(awk '{ print $4 }' "/proc/$writer/stat")
kill -STOP "$run_ctl"
kill -STOP -- "-$writer"
last=$(awk '$1 == "issue" { n = $2 } END { print n }' "$BF/A/writer.log")
lab_log "A FREEZES (SIGSTOP of its daemon, its run and its writer, after record $last): it still believes it holds db"

lab_log "B: blkfencectl acquire db"
bf_ctl B acquire db --timeout 30s | sed 's/^/          /'
epoch_b=$(bf_field B db epoch)
lab_log "registered keys now (read by B): $(lab_keyset "$b" || echo "(the read failed)")"
lab_write "$b" "$block0" "blkfence-lab node=B epoch=$epoch_b first record" &&
  lab_log "B (new holder, epoch $epoch_b) writes its first record"

kill -CONT -- "-$writer"
lab_log "A's writer resumes (SIGCONT) and writes on"
until grep -q '^fail' "$BF/A/writer.log"; do sleep 0.05; done
lab_log "A's write: REFUSED by the target: $(awk '$1 == "fail" { $1 = $2 = ""; sub(/^ +/, ""); print; exit }' "$BF/A/writer.log")"
kill -CONT "$(cat "$BF/A/pid")"
lab_log "A's daemon resumes (SIGCONT)"
fenced=$(bf_await A db state fenced) && fenced=yes
kill -CONT "$run_ctl"
wait "$run_pid"
run_status=$?
lab_log "blkfencectl run on A: the gate closed, it killed the writer (exit $run_status)"

echo
echo "records on the LU (read by B):"
for ((i = 0; i <= last + 5; i++)); do
  record=$(lab_read "$b" $((block0 + i)))
  [[ -n $record ]] && printf '  block %4d: %s\n' $((block0 + i)) "$record"
done
# A block that cannot be read counts against S1: it is not one without A's record.
late="" record=""
for ((i = last + 1; i <= last + 50; i++)); do
  lab_capture record lab_read "$b" $((block0 + i)) || { late+=" $i($record)"; continue; }
  [[ $record == *"node=A"* ]] && late+=" $i"
done
echo
lab_expect_eq "the target refused A's write after B's acquisition" \
  "$(awk '$1 == "fail" { $1 = $2 = ""; sub(/^ +/, ""); print; exit }' "$BF/A/writer.log")" "Invalid exchange"
lab_expect_eq "A's daemon reported fenced" "$fenced" yes
lab_expect_key "A's daemon reports fenced by B's key" "$(bf_field B db key)" bf_field A db fenced_by
lab_expect "A's token file is gone" test ! -e "$BF/A/run/db.token"
lab_expect_eq "blkfencectl run killed A's writer (exit 4)" "$run_status" 4
lab_expect_eq "S1: no record of A's epoch landed after B's acquisition${late:+ (landed:$late)}" "${late:-none}" none
lab_expect_read "B's first record is intact" "blkfence-lab node=B epoch=$epoch_b first record" lab_read "$a" "$block0"
bf_stop A
bf_stop B
lab_done

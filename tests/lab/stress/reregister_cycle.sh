#!/bin/bash
# Stress: the cycle the e2e mutant check drives (a fenced node re-registers its key while its
# writer keeps sending; the holder takes the key away again), ROUNDS times in a row on one LU,
# with sg_persist. B registers and holds type 5; A's writer (tests/lab/stress/writer.py, THREADS
# threads) writes all along; each round A registers its key and B removes it with PREEMPT (or
# PREEMPT AND ABORT). Every round must leave B the only key and holder; at the end A's writer must
# have had writes both land and refused. A wedged target ends the boot (tests/lab/run exit 125).
#   usage: reregister_cycle.sh preempt|preempt-abort ROUNDS [LU] [THREADS]
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
action=$1 rounds=$2 lu=${3:-0} threads=${4:-4}
[[ $action == preempt || $action == preempt-abort ]] || { echo "reregister_cycle: preempt or preempt-abort, not '$action'"; exit 2; }
a=$(lab_dev A "$lu") && b=$(lab_dev B "$lu") || { echo "LU $lu is not in the map"; exit 1; }
key_a=0x6c9d000100000005 key_b=0x6c9d000200000006

lab_pr --out --register-ignore --param-sark="$key_b" "$b" >/dev/null
lab_expect "B reserves type 5" lab_pr --out --reserve --param-rk="$key_b" --prout-type=5 "$b"
python3 "$BLKFENCE_LAB_REPO/tests/lab/stress/writer.py" "$a" 2000 "$threads" >"$BLKFENCE_LAB_OUT/stress-writer.out" &
writer=$!
lab_log "A's writer runs with $threads threads; $rounds rounds of register (A) / $action (B)"
bad=""
for ((round = 1; round <= rounds; round++)); do
  timeout 60 sg_persist -n --out --register-ignore --param-sark="$key_a" "$a" >/dev/null 2>&1 ||
    timeout 60 sg_persist -n --out --register-ignore --param-sark="$key_a" "$a" >/dev/null 2>&1 ||
    { bad="round $round: A's register failed"; break; }
  timeout 60 sg_persist -n --out --"$action" --param-rk="$key_b" --param-sark="$key_a" --prout-type=5 "$b" >/dev/null 2>&1 ||
    timeout 60 sg_persist -n --out --"$action" --param-rk="$key_b" --param-sark="$key_a" --prout-type=5 "$b" >/dev/null 2>&1 ||
    { bad="round $round: B's $action failed"; break; }
  ((round % 25 == 0)) && lab_log "round $round done"
done
lab_expect_eq "every round completed" "${bad:-yes}" yes
lab_expect_read "B is the only key left" "$key_b " lab_keyset "$b"
kill -TERM "$writer"
wait "$writer"
read -r _ ok refused other <"$BLKFENCE_LAB_OUT/stress-writer.out"
lab_log "A's writer: $ok writes landed, $refused refused, $other failed otherwise"
lab_expect "some of A's writes landed (while registered)" test "${ok:-0}" -gt 0
lab_expect "some of A's writes were refused (EBADE)" test "${refused:-0}" -gt 0
lab_pr --out --clear --param-rk="$key_b" "$b" >/dev/null
lab_done

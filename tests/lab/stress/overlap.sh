#!/bin/bash
# Stress: PR OUTs of two nodes overlapping in the target, on one LU, while A's writer keeps
# sending. B registers and holds type 5, A registers; then for SECONDS A repeats A_ACTION and B
# repeats B_ACTION (tests/lab/probe/prloop.cc, as fast as the target answers), with A's writer
# (tests/lab/stress/writer.py, THREADS threads) writing all along. Every command of both loops
# must get an answer, and B must still hold at the end. A wedged target ends the boot instead
# (tests/lab/run exit 125, with the kernel's backtraces).
#   usage: overlap.sh SECONDS A_ACTION B_ACTION [LU] [THREADS]
#   A_ACTION: register-ignore | reserve | release | preempt | preempt-abort (A takes on B's key)
#   B_ACTION: the same, B taking on A's key
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
seconds=$1 a_action=$2 b_action=$3 lu=${4:-0} threads=${5:-4}
: "${BLKFENCE_LAB_PRLOOP:?BLKFENCE_LAB_PRLOOP names blkfence-lab-prloop}"
a=$(lab_dev A "$lu") && b=$(lab_dev B "$lu") || { echo "LU $lu is not in the map"; exit 1; }
a_sg=$(lab_dev A "$lu" sg) b_sg=$(lab_dev B "$lu" sg)
key_a=0x6c9d000100000007 key_b=0x6c9d000200000008

lab_pr --out --register-ignore --param-sark="$key_b" "$b" >/dev/null
lab_expect "B reserves type 5" lab_pr --out --reserve --param-rk="$key_b" --prout-type=5 "$b"
lab_expect "A registers" lab_pr --out --register-ignore --param-sark="$key_a" "$a"
work=$BLKFENCE_LAB_OUT/overlap-$a_action-$b_action
mkdir -p "$work"
python3 "$BLKFENCE_LAB_REPO/tests/lab/stress/writer.py" "$a" 3000 "$threads" >"$work/writer.out" &
writer=$!
lab_log "for ${seconds}s: A $a_action, B $b_action, A's writer with $threads threads"
"$BLKFENCE_LAB_PRLOOP" "$a_sg" "$seconds" "$a_action" "$key_a" "$key_b" >"$work/a.out" 2>&1 &
loop_a=$!
"$BLKFENCE_LAB_PRLOOP" "$b_sg" "$seconds" "$b_action" "$key_b" "$key_a" >"$work/b.out" 2>&1 &
loop_b=$!
wait "$loop_a"; rc_a=$?
wait "$loop_b"; rc_b=$?
kill -TERM "$writer"
wait "$writer"
lab_log "A: $(tail -n 1 "$work/a.out")"
lab_log "B: $(tail -n 1 "$work/b.out")"
lab_log "A's writer: $(cat "$work/writer.out")"
lab_expect_eq "every PR OUT of A got an answer" "$rc_a" 0
lab_expect_eq "every PR OUT of B got an answer" "$rc_b" 0
# Whatever the last commands did, the LU answers and has a holder.
lab_expect "the LU still answers PR IN" lab_pr -r "$b"
lab_pr --out --register-ignore --param-sark="$key_b" "$b" >/dev/null
lab_pr --out --clear --param-rk="$key_b" "$b" >/dev/null
lab_done

#!/bin/bash
# The failover story, told as a timeline on a real LIO LU: node A holds the reservation and writes
# records stamped with its epoch; A freezes (SIGSTOP, as in a long GC pause or a VM migration); node
# B preempts A's key; A wakes up still believing it is the writer, and the target refuses its next
# write. Ends with the records on the LU: none of A's was written after B's preempt.
#
# Until blkfenced exists this drives each step with sg_persist and dd; the keys follow DESIGN.md §2
# (cluster 0x6c9d | node | epoch).
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
a=$(lab_dev A 0) && b=$(lab_dev B 0) || { echo "LU 0 is not in the map"; exit 1; }
key_a=0x6c9d000100000001  # node 1, epoch 1
key_b=0x6c9d000200000002  # node 2, epoch 2: B's acquisition is the newer token
preempt=--preempt-abort
[[ $LAB_FABRIC == tcm_loop ]] && preempt=--preempt  # PREEMPT AND ABORT deadlocks tcm_loop on 6.1
work=$(mktemp -d)

echo "blkfence failover demo: one LU ($(lab_dev A 0 wwn)) shared by node A ($a) and node B ($b) over $LAB_FABRIC"
echo
lab_log "A registers $key_a and reserves (Write Exclusive, registrants only)"
lab_pr --out --register-ignore --param-sark="$key_a" "$a" 2>/dev/null &&
  lab_pr --out --reserve --param-rk="$key_a" --prout-type=5 "$a" || exit 1
lab_pr --out --register-ignore --param-sark="$key_b" "$b" 2>/dev/null || exit 1
lab_log "B registers $key_b (standby)"
lab_log "holder as B sees it: $(lab_holder "$b")"

# A's writer: one record every 0.2 s, record n into 4 KiB block n, until the target refuses one.
# It runs as its own process group (job control), so that SIGSTOP freezes it whole, dd included,
# as a pause freezes a real writer.
set -m
(
  n=0
  while error=$(lab_write "$a" "$n" "A epoch 1 record $n"); do
    lab_log "A writes record $n: ok"
    echo "$n" >"$work/a-last"
    n=$((n + 1))
    sleep 0.2
  done
  lab_log "A writes record $n: REFUSED by the target: $error"
  echo "$error" >"$work/a-refused"
) &
writer=$!
set +m
until [[ $(cat "$work/a-last" 2>/dev/null) -ge 2 ]]; do sleep 0.05; done

kill -STOP -- -"$writer"
lab_log "A freezes (SIGSTOP): it still believes it is the writer"

lab_log "B preempts A's key ($preempt, PR OUT with RK=$key_b SARK=$key_a)"
lab_pr --out "$preempt" --param-rk="$key_b" --param-sark="$key_a" --prout-type=5 "$b" 2>/dev/null || exit 1
lab_log "registered keys now: $(lab_keys "$b" 2>/dev/null | tr '\n' ' ')"
lab_log "holder now: $(lab_holder "$b" 2>/dev/null)"
# S1 (DESIGN.md §4): from here on nothing of A's may land. Remember A's region as it is now.
a_region() { dd if="$b" bs=4096 count=1000 iflag=direct status=none | sha256sum; }
region_at_preempt=$(a_region)
lab_write "$b" 1000 "B epoch 2 record 0" && lab_log "B (new holder) writes its first record into block 1000: ok"

kill -CONT -- -"$writer"
lab_log "A resumes (SIGCONT) and writes on"
wait "$writer"

echo
echo "records on the LU (read by B):"
for ((i = 0; i < 1000; i++)); do
  record=$(lab_read "$b" "$i")
  [[ -n $record ]] || break
  printf '  block %4d: %s\n' "$i" "$record"
done
printf '  block %4d: %s\n' 1000 "$(lab_read "$b" 1000)"
echo
lab_expect_eq "A's write after the preempt was refused with EBADE" "$(cat "$work/a-refused" 2>/dev/null)" "Invalid exchange"
lab_expect_eq "nothing of A's landed after B's preempt" "$(a_region)" "$region_at_preempt"
lab_expect_eq "B's record is intact" "$(lab_read "$a" 1000)" "B epoch 2 record 0"
lab_done

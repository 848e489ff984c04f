#!/bin/bash
# Proves PREEMPT AND ABORT over iSCSI completes while the old holder has O_DIRECT writes in flight
# (over tcm_loop on 6.1 it deadlocks; docs/design.md §7), and that it fences: the holder's writers all
# end with EBADE, only B's key is left, and B holds the reservation.
#   usage: preempt_abort_inflight.sh [LU]   (default 0)
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
lu=${1:-0}
a=$(lab_dev A "$lu") && b=$(lab_dev B "$lu") || { echo "LU $lu is not in the map"; exit 1; }
key_a=0x6c9d000100000003 key_b=0x6c9d000200000004
work=$(mktemp -d)

lab_expect "A registers" lab_pr --out --register-ignore --param-sark="$key_a" "$a"
lab_expect "B registers" lab_pr --out --register-ignore --param-sark="$key_b" "$b"
lab_expect "A reserves type 5" lab_pr --out --reserve --param-rk="$key_a" --prout-type=5 "$a"

# Four writers, each rewriting its own quarter of the LU with 1 MiB O_DIRECT writes until refused.
size_mb=$(($(blockdev --getsize64 "$a") >> 20))
for w in 0 1 2 3; do
  (
    while dd if=/dev/zero of="$a" bs=1M count=$((size_mb / 4)) seek=$((w * size_mb / 4)) \
      oflag=direct status=none 2>"$work/err.$w"; do
      echo >>"$work/passes.$w"
    done
  ) &
done

# Fire while the block layer reports writes in flight on A's device (bounded wait).
inflight=0
for ((try = 0; try < 500; try++)); do
  read -r _ inflight <"/sys/block/${a#/dev/}/inflight"
  ((inflight > 0)) && break
  sleep 0.01
done
lab_log "A has $inflight writes in flight; B preempts and aborts"
lab_expect "A had writes in flight" test "$inflight" -gt 0
lab_expect "B's PREEMPT AND ABORT succeeds" timeout 60 \
  sg_persist -n --out --preempt-abort --param-rk="$key_b" --param-sark="$key_a" --prout-type=5 "$b"
lab_log "PREEMPT AND ABORT returned"

# Every writer must stop on its own: the target refuses them.
stopped=0
for ((try = 0; try < 600; try++)); do
  [[ -z $(jobs -rp) ]] && { stopped=1; break; }
  sleep 0.1
done
lab_expect_eq "every writer of A stopped within 60 s" "$stopped" 1
lab_expect_eq "every writer ended with EBADE" \
  "$(for w in 0 1 2 3; do sed -n 's/.*: //p' "$work/err.$w" | tail -n 1; done | sort -u)" "Invalid exchange"
lab_expect_read "only B's key is registered" "$key_b " lab_keyset "$b"
lab_expect_read "B holds" "$key_b Write Exclusive, registrants only" lab_holder "$a"
lab_expect "B writes" lab_write "$b" 0 "B after abort"

lab_pr --out --clear --param-rk="$key_b" "$b" >/dev/null
lab_done

#!/bin/bash
# Proves the fencing primitive on real LIO: nodes A and B register, A reserves Write Exclusive -
# Registrants Only, B preempts A. Afterwards the target refuses A's O_DIRECT write with EBADE
# ("Invalid exchange", the block layer's RESERVATION CONFLICT), B's write lands, and both nodes read
# the same keys and holder through sg_persist over their own I_T nexus.
#   usage: preempt.sh [LU]   (default 0)
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
lu=${1:-0}
a=$(lab_dev A "$lu") && b=$(lab_dev B "$lu") || { echo "LU $lu is not in the map"; exit 1; }
key_a=0x6c9d000100000001 key_b=0x6c9d000200000002
we_ro="Write Exclusive, registrants only"

lab_log "LU $lu: A is $a, B is $b ($LAB_FABRIC)"
lab_expect "A registers $key_a" lab_pr --out --register-ignore --param-sark="$key_a" "$a"
lab_expect "B registers $key_b" lab_pr --out --register-ignore --param-sark="$key_b" "$b"
lab_expect_read "B reads both keys" "$key_a $key_b " lab_keyset "$b"
lab_expect "A reserves type 5" lab_pr --out --reserve --param-rk="$key_a" --prout-type=5 "$a"
lab_expect_read "B reads A as holder" "$key_a $we_ro" lab_holder "$b"
lab_expect "A (holder) writes" lab_write "$a" 0 "A epoch 1"

lab_log "B preempts A"
lab_expect "B preempts A" lab_pr --out --preempt --param-rk="$key_b" --param-sark="$key_a" --prout-type=5 "$b"
lab_expect_read "A reads only B's key" "$key_b " lab_keyset "$a"
lab_expect_read "B reads only B's key" "$key_b " lab_keyset "$b"
lab_expect_read "A reads B as holder" "$key_b $we_ro" lab_holder "$a"
lab_expect_read "B reads B as holder" "$key_b $we_ro" lab_holder "$b"

error=$(lab_write "$a" 0 "A epoch 1, after the preempt") && error="the write succeeded"
lab_log "A writes after the preempt: $error"
lab_expect_eq "the target refuses A's write with EBADE" "$error" "Invalid exchange"
lab_expect "B (new holder) writes" lab_write "$b" 0 "B epoch 2"
lab_expect_read "A reads B's data, not its own" "B epoch 2" lab_read "$a" 0

# Leave the LU clean for the next check in the same boot.
lab_pr --out --clear --param-rk="$key_b" "$b" >/dev/null
lab_done

#!/bin/bash
# Proves that more commands than sg.c accepts per file descriptor (16) can be put on one path at
# once with either transport: the rest wait in the transport's queue and every one completes GOOD.
#   usage: outstanding.sh LU
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
sg=$(lab_dev A "${1:?lu}" sg) || exit 1
for transport in uring sgio; do
  lab_expect "40 READ KEYS at once on $sg ($transport)" "$BLKFENCE_LAB_OUTSTANDING" "$transport" "$sg" 40
done
lab_done

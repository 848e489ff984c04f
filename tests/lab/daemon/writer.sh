#!/bin/bash
# A writer for the lab's failover checks, run under `blkfencectl run`: writes one 4 KiB O_DIRECT
# record after another to DEV at blocks BLOCK0+1, BLOCK0+2, ..., each stamped with the node, the
# epoch of its token (BLKFENCE_EPOCH) and its sequence number, and logs "issue N" before and
# "ok N" or "fail N ERROR" after each write. Runs until killed.
#   usage: writer.sh NODE DEV BLOCK0 LOG
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
node=$1 dev=$2 block0=$3 log=$4
: "${BLKFENCE_EPOCH:?writer.sh runs under blkfencectl run}"
echo $$ >"$log.pid"  # the leader of the process group blkfencectl run made for it
for ((seq = 1; ; seq++)); do
  echo "issue $seq" >>"$log"
  if error=$(lab_write "$dev" $((block0 + seq)) "blkfence-lab node=$node epoch=$BLKFENCE_EPOCH seq=$seq"); then
    echo "ok $seq" >>"$log"
  else
    echo "fail $seq $error" >>"$log"
  fi
  sleep 0.05
done

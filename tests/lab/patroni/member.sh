#!/bin/bash
# The lab's stand-in for a member's systemd units (tests/lab/patroni): the guest runs blkfenced and
# Patroni without systemd, so this plays what integrations/patroni ships for production.
#   member.sh rejoin NODE   NODE's on_fenced command (blkfenced runs it when NODE is fenced), as
#                           blkfence-patroni-rejoin@pg.service would: the shipped
#                           blkfence-patroni-rejoin with NODE's settings; its log goes to
#                           $PGL/rejoin-node.log. blkfenced spawns it in its own process group,
#                           reaps it and logs its exit status, so it needs no detaching here.
#   member.sh stop NODE     what `systemctl stop patroni` does: SIGTERM to NODE's Patroni, which
#                           stops PostgreSQL and exits; waits for it (60 s, then SIGKILL and exit 1).
#   member.sh start NODE    what `systemctl start patroni` does: NODE's Patroni, started as
#                           lib.sh's pgl_patroni_start starts it.
# It runs with blkfenced's environment (BLKFENCE_LAB_REPO, BLKFENCECTL, BLKFENCED, ...).
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/patroni/lib.sh"
trap - EXIT  # tests/lab/daemon/lib.sh saves the daemons' logs on exit; the check does that
action=${1:-} node=${2:-}
[[ $node == A || $node == B ]] || { echo "usage: member.sh rejoin|stop|start A|B" >&2; exit 2; }
x=$(pgl_lower "$node")

case $action in
  rejoin)
    exec >>"$PGL/rejoin-$x.log" 2>&1
    self=$BLKFENCE_LAB_REPO/tests/lab/patroni/member.sh
    BLKFENCE_SOCKET=$BF/$node/run/control.sock \
      BLKFENCE_PATRONI_URL=http://127.0.0.1:${pgl_rest_port[$node]} \
      BLKFENCE_PATRONI_STOP="$self stop $node" BLKFENCE_PATRONI_START="$self start $node" \
      BLKFENCE_REJOIN_WAIT=${PGL_REJOIN_WAIT:-120} \
      exec "$PGL_LIBDIR/blkfence-patroni-rejoin" pg "/lab/pg/$x"
    ;;
  stop)
    read -r pid <"$PGL/patroni-$x.pid" || exit 1
    kill -TERM "$pid" 2>/dev/null
    for ((try = 0; try < 600; try++)); do
      bf_alive "$pid" || exit 0
      sleep 0.1
    done
    echo "member.sh: $node's Patroni (pid $pid) still runs 60 s after SIGTERM; killing it" >&2
    kill -KILL "$pid"
    exit 1
    ;;
  start)
    pgl_hook_env "$node"
    pgl_patroni_start "$node"
    ;;
  *)
    echo "member.sh: unknown action '$action'; usage: member.sh rejoin|stop|start A|B" >&2
    exit 2
    ;;
esac

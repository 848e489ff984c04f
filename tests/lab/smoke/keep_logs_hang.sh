#!/bin/bash
# A check that hangs past its deadline after naming its logs (lib/guest.sh's lab_keep_logs): a
# daemon's log at the top of the directory and another one level down, each carrying a marker,
# then a sleep that only the watchdog ends. tests/lab/watchdog_selftest asserts that both reach
# the host in kept-logs/ and that the runner names them.
#   usage: keep_logs_hang.sh MARKER
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
marker=${1:?usage: keep_logs_hang.sh MARKER}
dir=/tmp/keep-logs-hang
mkdir -p "$dir/node"
lab_keep_logs "$dir" hang
echo "daemon: $marker" >"$dir/daemon.log"
echo "node: $marker" >"$dir/node/log"
echo "not a log: $marker" >"$dir/state"
echo "hanging until the watchdog ends the test"
sleep 3600

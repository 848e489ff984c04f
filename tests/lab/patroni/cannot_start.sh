#!/bin/bash
# What the Patroni checks do when postgres cannot reach what it needs (tests/lab/patroni/lib.sh):
# the clone is 0700 in the guest (tests/lab/guest/job.sh), as a clone under /root is.
#   1. pgl_check_access names each path postgres cannot reach, the permission missing and the
#      directory that denies it: a missing control socket, a file that is no socket, the shipped
#      hook and blkfencectl run from the clone, and a Patroni configuration in a 0700 directory;
#      it passes on what pgl_install installed and a socket as blkfenced makes it.
#   2. A Patroni started from a directory postgres cannot enter (what happened when the lab
#      started Patroni from the clone): Patroni's initdb succeeds, the child through which it starts
#      the postmaster dies on chdir(), and Patroni waits for ever. pgl_await must give up as soon
#      as that child's PermissionError is in Patroni's log, with that line, not after its tries.
#   usage: cannot_start.sh
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/patroni/lib.sh"
PGL_RUN=cannot_start
trap 'pgl_teardown; rm -rf /tmp/pgl-private' EXIT
pgl_teardown
mkdir -p "$PGL" /tmp/pgl-private
chmod 0700 /tmp/pgl-private
repo_mode=$(stat -c %a "$BLKFENCE_LAB_REPO")
lab_expect_eq "the clone is 0700 in the guest" "$repo_mode" 700

# has LINE TEXT: TEXT has a line that starts with LINE.
has() { grep -qF -- "$1" <<<"$2" && [[ $(grep -F -- "$1" <<<"$2" | head -n 1) == "$1"* ]]; }

# --- 1. the access check ------------------------------------------------------------------------
lab_expect "A's file system" pgl_fs A
lab_expect "etcd answers" pgl_etcd_start
pgl_hook_env A
lab_expect "A's patroni.yml" pgl_config A
lab_expect "the hooks and blkfencectl installed for postgres" pgl_install
# A's blkfenced is not started here: the check finds its control socket missing, then refuses a
# file that is not a socket.
denied=$(pgl_check_access A 2>&1)
lab_expect "pgl_check_access fails while A's control socket is missing" test "$?" -ne 0
lab_expect "... names it, and nothing else ($denied)" test "$denied" = \
  "postgres cannot connect to $BF/A/run/control.sock: no such file"
mkdir -p "$BF/A/run"
touch "$BF/A/run/control.sock" && chgrp postgres "$BF/A/run/control.sock" && chmod 0660 "$BF/A/run/control.sock"
denied=$(pgl_check_access A 2>&1)
lab_expect "... nor a file that is no socket ($denied)" has \
  "postgres cannot connect to $BF/A/run/control.sock (-rw-rw----" "$denied"
rm -f "$BF/A/run/control.sock"
lab_expect "a socket that postgres may connect to, as blkfenced makes it" eval \
  "python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' '$BF/A/run/control.sock' &&
   chgrp postgres '$BF/A/run/control.sock' && chmod 0660 '$BF/A/run/control.sock'"
lab_expect "pgl_check_access passes on what pgl_install installed" pgl_check_access A
# The first directory on the way to the clone that postgres cannot search: the clone itself, or a
# directory above it (/root, a `mktemp -d` directory).
denier="" path=""
IFS=/ read -r -a parts <<<"${BLKFENCE_LAB_REPO#/}"
for part in "${parts[@]}"; do
  path+=/$part
  setpriv --reuid=postgres --regid=postgres --init-groups -- test -x "$path" || { denier=$path; break; }
done
lab_expect "postgres cannot reach the clone (it is 0700): $denier" test -n "$denier"
denied=$(PGL_LIBDIR=$BLKFENCE_LAB_REPO/integrations/patroni PGL_BLKFENCECTL=$BLKFENCECTL pgl_check_access A 2>&1)
lab_expect "the hook in the clone is refused, $denier named ($denied)" has \
  "postgres cannot execute $BLKFENCE_LAB_REPO/integrations/patroni/blkfence-patroni-hook: no search permission on $denier (drwx" "$denied"
if [[ $BLKFENCECTL == "$BLKFENCE_LAB_REPO"/* ]]; then
  lab_expect "... and so is blkfencectl in its build tree" has \
    "postgres cannot execute $BLKFENCECTL: no search permission on $denier (drwx" "$denied"
fi
cp "$PGL/a.yml" /tmp/pgl-private/a.yml
denied=$(PGL=/tmp/pgl-private pgl_check_access A 2>&1)
lab_expect "a configuration in a 0700 directory is refused ($denied)" has \
  "postgres cannot read /tmp/pgl-private/a.yml: no search permission on /tmp/pgl-private (drwx------ root:root)" "$denied"

# --- 2. Patroni started where postgres cannot enter ----------------------------------------------
t0=$EPOCHREALTIME
pgl_patroni_start A /tmp/pgl-private
why=$(pgl_await A /primary 900)
lab_expect "pgl_await fails" test "$?" -ne 0
lab_log "pgl_await gave up $(pgl_ms_since "$t0") ms after Patroni started"
lab_expect "... on the postmaster starter's PermissionError on the directory ($(head -n 1 <<<"$why"))" has \
  "A's Patroni could not start the postmaster: PermissionError: [Errno 13] Permission denied: '/tmp/pgl-private'" "$why"
lab_expect "... before its tries ran out" eval '[[ $why != *"did not answer 200 after"* ]]'
lab_done

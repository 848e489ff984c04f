# shellcheck shell=bash
# Helpers for the Patroni lab checks (sourced after tests/lab/lib/guest.sh; bash).
#
# A two-member Patroni cluster in one guest: etcd on 127.0.0.1 (data on the guest's tmpfs), and
# for each node X (A, B) an ext4 on X's own LU seen through X's own nexus, mounted at
# /lab/pg/x, with PGDATA in it; Patroni runs as postgres with the configuration generated from
# integrations/patroni/patroni.yml.in (what we ship is what we test) and its hook,
# integrations/patroni/blkfence-patroni-hook. Node A: LU 0, PostgreSQL 5432, REST 8008; node B:
# LU 1, 5433, 8009. Work files are under $PGL (logs reach the host through pgl_save_logs, and at
# the watchdog's deadline through lab_keep_logs).
#
# Everything that runs as postgres is started from / and runs only what postgres can reach, as
# under systemd: the clone may sit in a directory only root can enter (/root, or `mktemp -d`; the
# guest makes the clone itself 0700 to prove it, tests/lab/guest/job.sh), so the hook scripts and
# blkfencectl are installed where an operator installs them (pgl_install), and
# pgl_check_access names any path postgres cannot reach before Patroni starts.
set -o pipefail

PGL=/tmp/pgl
# The shipped scripts, installed as a source install puts them (integrations/patroni/README.md),
# and the blkfencectl that the hooks run.
PGL_LIBDIR=/usr/local/lib/blkfence
PGL_BLKFENCECTL=/usr/local/sbin/blkfencectl
PGL_PASSWORD=lab-secret
# etcd's, Patroni's (PostgreSQL's log goes to Patroni's stderr) and the hooks' logs reach the host
# even when the watchdog ends the check (member.sh, run by blkfenced, sources this without it).
declare -F lab_keep_logs >/dev/null && lab_keep_logs "$PGL" patroni
declare -A pgl_lu=([A]=0 [B]=1) pgl_pg_port=([A]=5432 [B]=5433) pgl_rest_port=([A]=8008 [B]=8009)
PGL_CONNINFO="host=127.0.0.1,127.0.0.1 port=5432,5433 user=postgres password=$PGL_PASSWORD dbname=postgres target_session_attrs=read-write"

# pgl_ms_since T0: milliseconds from the EPOCHREALTIME T0 until now.
pgl_ms_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }'; }

pgl_lower() { printf '%s' "${1,,}"; }

# pgl_save_logs: etcd's, every Patroni's and the hooks' output go out with the job's results; when
# a check of the run failed, the names of the files to read are printed.
pgl_save_logs() {
  local f saved=()
  for f in "$PGL"/*.log; do
    [[ -f $f ]] || continue
    cp "$f" "$BLKFENCE_LAB_OUT/patroni-${PGL_RUN:-run}-$(basename "$f")" &&
      saved+=("patroni-${PGL_RUN:-run}-$(basename "$f")")
  done
  if ((${lab_checks_failed:-0} > 0 && ${#saved[@]} > 0)); then
    echo "lab: the logs of this run (etcd, Patroni with PostgreSQL, the hooks) are in the lab's out directory: ${saved[*]}"
  fi
  return 0
}

# pgl_install: the hook and rejoin scripts, and blkfencectl, where a source install puts them
# (the guest's / is a tmpfs overlay), so that postgres can run them wherever the clone is.
pgl_install() {
  install -d -m 0755 "$PGL_LIBDIR" "${PGL_BLKFENCECTL%/*}" &&
    install -m 0755 "$BLKFENCE_LAB_REPO/integrations/patroni/blkfence-patroni-hook" \
      "$BLKFENCE_LAB_REPO/integrations/patroni/blkfence-patroni-rejoin" "$PGL_LIBDIR/" &&
    install -m 0755 "$BLKFENCECTL" "$PGL_BLKFENCECTL"
}

# pgl_check_access NODE: everything NODE's Patroni and its hooks reach as postgres, checked as
# postgres in one process: the directory it starts in, the programs it runs, its configuration,
# work, socket and data directories, and the control socket of NODE's blkfenced (a socket it may
# connect to). Prints one line per path it cannot reach, naming the path, the permission missing
# and the first directory on the way that denies it (its mode and owner), and fails; silent when
# all is reachable.
pgl_check_access() {
  local x
  x=$(pgl_lower "$1")
  # shellcheck disable=SC2016 # the script runs in postgres's bash, with its own arguments
  setpriv --reuid=postgres --regid=postgres --init-groups -- /bin/bash -c '
    declare -A verb=([x]=execute [r]=read [S]="connect to" [s]=enter [d]="enter and write")
    bad=0
    while (($#)); do
      want=$1 path=$2
      shift 2
      # The first directory on the way that postgres cannot search.
      dir="" denied=""
      IFS=/ read -r -a parts <<<"${path#/}"
      for ((i = 0; i + 1 < ${#parts[@]}; i++)); do
        dir+=/${parts[i]}
        [[ -e $dir ]] || break  # missing: said below
        [[ -x $dir ]] || { denied=$dir; break; }
      done
      if [[ -n $denied ]]; then
        echo "postgres cannot ${verb[$want]} $path: no search permission on $denied ($(stat -c "%A %U:%G" "$denied" 2>&1))"
        bad=1
        continue
      fi
      if [[ ! -e $path ]]; then
        echo "postgres cannot ${verb[$want]} $path: no such file"
        bad=1
        continue
      fi
      case $want in
        x) [[ -f $path && -x $path ]] ;;
        r) [[ -r $path ]] ;;
        S) [[ -S $path && -w $path ]] ;;
        s) [[ -d $path && -x $path ]] ;;
        d) [[ -d $path && -x $path && -w $path ]] ;;
      esac || {
        echo "postgres cannot ${verb[$want]} $path ($(stat -c "%A %U:%G" "$path" 2>&1))"
        bad=1
      }
    done
    exit $bad' pgl_check_access \
    s / x /usr/bin/patroni x /usr/bin/python3 x /usr/lib/postgresql/15/bin/postgres \
    x /usr/lib/postgresql/15/bin/pg_ctl x /usr/lib/postgresql/15/bin/initdb \
    x "$PGL_LIBDIR/blkfence-patroni-hook" x "$PGL_BLKFENCECTL" \
    r "$PGL/$x.yml" d "$PGL" d "$PGL/sock-$x" d "/lab/pg/$x/data" \
    S "$BF/$1/run/control.sock"
}

# pgl_check_access_all NODE...: pgl_check_access for every NODE, each one's problems printed.
pgl_check_access_all() {
  local node ok=0
  for node in "$@"; do
    pgl_check_access "$node" || ok=1
  done
  return "$ok"
}

# pgl_fs NODE: a fresh ext4 on NODE's own LU through NODE's nexus, mounted at /lab/pg/node, with
# an empty PGDATA directory owned by postgres.
pgl_fs() {
  local node=$1 dev dir
  dir=/lab/pg/$(pgl_lower "$1")
  dev=$(lab_dev "$node" "${pgl_lu[$node]}") || return 1
  mkdir -p "$dir" &&
    mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=1 "$dev" &&
    mount -o noatime "$dev" "$dir" &&
    mkdir -m 700 "$dir/data" && chown postgres: "$dir/data"
}

# pgl_etcd_start: one etcd member on 127.0.0.1 (client 2379, peer 2380), waits until it answers.
pgl_etcd_start() {
  local try
  mkdir -p "$PGL/etcd" && chmod 700 "$PGL/etcd"
  etcd --name lab --data-dir "$PGL/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster lab=http://127.0.0.1:2380 --initial-cluster-state new \
    >>"$PGL/etcd.log" 2>&1 &
  echo $! >"$PGL/etcd.pid"
  for ((try = 0; try < 300; try++)); do
    [[ $(curl -s -m 2 http://127.0.0.1:2379/health 2>/dev/null) == *'"health":"true"'* ]] && return 0
    kill -0 "$(cat "$PGL/etcd.pid")" 2>/dev/null || { echo "etcd died:"; tail -5 "$PGL/etcd.log"; return 1; }
    sleep 0.2
  done
  echo "etcd did not answer in 60 s"; tail -5 "$PGL/etcd.log"
  return 1
}

# pgl_config NODE [PRE_PROMOTE]: NODE's patroni.yml from the shipped template. PRE_PROMOTE replaces
# the pre_promote command (the control run's /bin/true).
pgl_config() {
  local node=$1 pre_promote=${2:-} x
  x=$(pgl_lower "$node")
  mkdir -p "$PGL/sock-$x" && chown postgres: "$PGL" "$PGL/sock-$x"
  sed -e "s|@SCOPE@|lab|; s|@NAME@|pg-$x|" \
    -e "s|@REST_ADDRESS@|127.0.0.1:${pgl_rest_port[$node]}|; s|@PG_ADDRESS@|127.0.0.1:${pgl_pg_port[$node]}|" \
    -e "s|@ETCD_HOSTS@|127.0.0.1:2379|; s|@HOOK@|$PGL_LIBDIR/blkfence-patroni-hook|" \
    -e "s|@RESOURCE@|pg|; s|@DATA_DIR@|/lab/pg/$x/data|; s|@PGPASS@|$PGL/pgpass-$x|" \
    -e "s|@SOCKET_DIR@|$PGL/sock-$x|; s|@[A-Z]*_PASSWORD@|$PGL_PASSWORD|" \
    "$BLKFENCE_LAB_REPO/integrations/patroni/patroni.yml.in" >"$PGL/$x.yml" || return 1
  if [[ -n $pre_promote ]]; then
    sed -i "s|^  pre_promote: .*|  pre_promote: $pre_promote|" "$PGL/$x.yml" || return 1
  fi
  if grep -n '@[A-Z_]*@' "$PGL/$x.yml"; then
    echo "pgl_config: placeholders left in $PGL/$x.yml"
    return 1
  fi
}

# pgl_fstab NODE: an /etc/fstab entry for NODE's file system (the guest's / is a tmpfs overlay), as
# a production PGDATA has one: blkfence-patroni-rejoin mounts it again by its mount point.
pgl_fstab() {
  local dir dev
  dir=/lab/pg/$(pgl_lower "$1")
  dev=$(lab_dev "$1" "${pgl_lu[$1]}") || return 1
  sed -i "\| $dir |d" /etc/fstab && printf '%s %s ext4 noatime 0 0\n' "$dev" "$dir" >>/etc/fstab
}

# pgl_hook_env NODE...: PGL_HOOK_ENV_NODE for each NODE, the environment its Patroni's hooks need to
# reach NODE's blkfenced (read by pgl_patroni_start).
pgl_hook_env() {
  local node
  for node in "$@"; do
    mapfile -t "PGL_HOOK_ENV_$node" < <(printf '%s\n' "BLKFENCECTL=$PGL_BLKFENCECTL" "BLKFENCE_SOCKET=$BF/$node/run/control.sock")
  done
}

# pgl_bf_config NODE NODE_ID [ON_FENCED]: NODE's blkfenced configuration, in tests/lab/daemon/lib.sh's
# layout under $BF: resource "pg", mode "primary", over both LUs (every member's PGDATA) through
# NODE's own nexuses; Patroni's hooks run as postgres, hence control_group. ON_FENCED is the TOML
# value of on_fenced (default "none").
pgl_bf_config() {
  local node=$1 id=$2 on_fenced=${3:-'"none"'} dir=$BF/$1
  mkdir -p "$dir/state" "$dir/run"
  cat >"$dir/blkfence.toml" <<TOML
cluster = "lab"
node_id = $id
state_dir = "$dir/state"
run_dir = "$dir/run"
control_group = "postgres"

[[resource]]
name = "pg"
devices = ["$(lab_dev "$node" 0 sg)", "$(lab_dev "$node" 1 sg)"]
mode = "primary"
preempt = "preempt"
check_interval = "500ms"
lease = "3s"
command_timeout = "2s"
on_fenced = $on_fenced
TOML
}

# pgl_patroni_start NODE [DIR]: NODE's Patroni as postgres (setpriv execs, so the pid is
# Patroni's), with the environment its hooks need to reach NODE's blkfenced (PGL_HOOK_ENV_NODE, an
# array of NAME=VALUE that the check sets for each node). It starts in DIR, by default /, as
# systemd starts a service: Patroni starts the postmaster through multiprocessing's spawn, whose
# child first changes into the parent's working directory and dies when postgres cannot enter it
# (the clone's, when it sits in /root); Patroni then waits for a postmaster that never comes.
# Only patroni/cannot_start.sh passes DIR.
pgl_patroni_start() {
  local node=$1 dir=${2:-/} x
  x=$(pgl_lower "$node")
  local -n hook_env=PGL_HOOK_ENV_$node
  # Where this Patroni's output starts in the log (pgl_patroni_failed reads from there).
  stat -c %s "$PGL/patroni-$x.log" 2>/dev/null >"$PGL/patroni-$x.from" || echo 0 >"$PGL/patroni-$x.from"
  (
    cd "$dir" &&
      exec env "${hook_env[@]}" HOME="$PGL" \
        setpriv --reuid=postgres --regid=postgres --init-groups -- \
        /usr/bin/patroni "$PGL/$x.yml"
  ) >>"$PGL/patroni-$x.log" 2>&1 </dev/null &
  echo $! >"$PGL/patroni-$x.pid"
  disown  # teardown kills it: no job notice
}

# pgl_patroni_failed NODE: succeeds, printing why, when NODE's Patroni can no longer come up: its
# process is gone, or the child through which it starts the postmaster (multiprocessing's spawn)
# died with an exception, which Patroni does not notice: it waits for a postmaster that never
# comes (a working directory postgres cannot enter raises PermissionError there).
pgl_patroni_failed() {
  local x pid from log fatal
  x=$(pgl_lower "$1")
  log=$PGL/patroni-$x.log
  read -r pid 2>/dev/null <"$PGL/patroni-$x.pid" || { echo "$1's Patroni was never started"; return 0; }
  read -r from 2>/dev/null <"$PGL/patroni-$x.from" || from=0
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "$1's Patroni (pid $pid) has exited; $log ends:"
    tail -n 15 "$log"
    return 0
  fi
  # A traceback through spawn.py, and its last line: the exception, at the start of a line; in
  # what this Patroni wrote (the log is appended to across restarts).
  fatal=$(tail -c +$((from + 1)) "$log" | awk '/multiprocessing\/spawn\.py/ { spawn = 1 }
               spawn && /^[A-Za-z_.]*(Error|Exception): / { print; exit }')
  [[ -n $fatal ]] || return 1
  echo "$1's Patroni could not start the postmaster: $fatal; $log ends:"
  tail -n 15 "$log"
  return 0
}

# pgl_rest NODE PATH: the HTTP status of GET PATH on NODE's Patroni REST API (200 for /primary
# when NODE is the running primary holding the leader lock, for /replica when a running replica).
pgl_rest() {
  curl -s -m 3 -o /dev/null -w '%{http_code}' "http://127.0.0.1:${pgl_rest_port[$1]}$2" 2>/dev/null
}

# pgl_await NODE PATH TRIES: waits (0.2 s steps) until pgl_rest NODE PATH answers 200; gives up
# at once, with the reason, when NODE's Patroni can no longer come up (pgl_patroni_failed).
pgl_await() {
  local node=$1 path=$2 tries=$3 try
  for ((try = 0; try < tries; try++)); do
    [[ $(pgl_rest "$node" "$path") == 200 ]] && return 0
    pgl_patroni_failed "$node" && return 1
    sleep 0.2
  done
  echo "pgl_await: $node's $path did not answer 200 after $tries tries; its log ends:"
  tail -5 "$PGL/patroni-$(pgl_lower "$node").log"
  return 1
}

# pgl_psql NODE SQL: one statement on NODE's PostgreSQL, unaligned tuples only.
pgl_psql() {
  PGPASSWORD=$PGL_PASSWORD PGCONNECT_TIMEOUT=5 psql -X -q -At -v ON_ERROR_STOP=1 \
    -h 127.0.0.1 -p "${pgl_pg_port[$1]}" -U postgres -d postgres -c "$2"
}

# pgl_postmaster_group NODE: the process group of NODE's postmaster and its children. Patroni
# starts the postmaster from a helper process that calls setsid() and exits, so the group is that
# helper's pid, not the postmaster's (/proc/PID/stat field 5).
pgl_postmaster_group() {
  local pid stat
  read -r pid <"/lab/pg/$(pgl_lower "$1")/data/postmaster.pid" && [[ $pid =~ ^[0-9]+$ ]] || return 1
  read -r stat <"/proc/$pid/stat" || return 1
  stat=${stat##*) }  # the fields after "(comm)": state ppid pgrp ...
  read -r _ _ pgid _ <<<"$stat"
  [[ $pgid =~ ^[0-9]+$ ]] && printf '%s\n' "$pgid"
}

# pgl_count PATTERN FILE: how many lines of FILE match (0 when FILE does not exist yet).
pgl_count() {
  local n
  n=$(grep -c -- "$1" "$2" 2>/dev/null)
  printf '%s\n' "${n:-0}"
}

# pgl_await_promoted NODE TRIES: waits (0.2 s steps) until NODE's PostgreSQL is out of recovery.
# Patroni's REST /primary answers 200 as soon as the node holds the leader lock, before
# pre_promote has run; only pg_is_in_recovery() says the promotion happened.
pgl_await_promoted() {
  local try
  for ((try = 0; try < $2; try++)); do
    [[ $(pgl_psql "$1" "SELECT pg_is_in_recovery()" 2>/dev/null) == f ]] && return 0
    sleep 0.2
  done
  echo "pgl_await_promoted: $1 is still in recovery; its log ends:"
  tail -5 "$PGL/patroni-$(pgl_lower "$1").log"
  return 1
}

# pgl_teardown: every process of the run killed (stopped ones too), the file systems unmounted,
# the LUs' registrations and reservations cleared, the work files removed (logs saved first).
pgl_teardown() {
  local f pid
  pgl_save_logs
  for x in a b; do
    pid=$(pgl_postmaster_group "${x^^}" 2>/dev/null) && { kill -KILL -- "-$pid"; kill -CONT -- "-$pid"; } 2>/dev/null
  done
  for f in "$PGL"/client*.pid "$PGL"/patroni-*.pid "$PGL"/postmaster-*.group "$PGL"/etcd.pid; do
    [[ -f $f ]] || continue
    read -r pid <"$f" || continue
    kill -KILL -- "-$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
    kill -CONT -- "-$pid" 2>/dev/null
  done
  for node in A B; do
    [[ -f $BF/$node/pid ]] && bf_stop "$node"
  done
  bf_save_logs
  rm -rf "$BF"
  sleep 0.5
  for x in a b; do
    mountpoint -q "/lab/pg/$x" && { umount "/lab/pg/$x" || umount -l "/lab/pg/$x"; }
  done
  rm -rf "$PGL"
  return 0
}

# Helpers for lab checks that run blkfenced (sourced after tests/lab/lib/guest.sh; bash).
#
# Each node runs its own daemon under /tmp/bf/<node> (config, state_dir, run_dir, log), using only
# its own nexuses (the map's sg nodes of that node), talking to blkfencectl through its own socket.

BF=/tmp/bf
: "${BLKFENCED:?BLKFENCED must name the blkfenced binary (tests/lab/CMakeLists.txt passes it)}"
: "${BLKFENCECTL:?BLKFENCECTL must name the blkfencectl binary}"

# The daemons' logs go out with the job's results, whatever happens.
bf_save_logs() {
  local node
  for node in A B; do
    [[ -f $BF/$node/log ]] && cp "$BF/$node/log" "$BLKFENCE_LAB_OUT/blkfenced-$node.log"
  done
  return 0
}
trap bf_save_logs EXIT

# bf_ctl NODE ARGS...: blkfencectl against NODE's daemon.
bf_ctl() { local node=$1; shift; BLKFENCE_SOCKET=$BF/$node/run/control.sock "$BLKFENCECTL" "$@"; }

# bf_config NODE NODE_ID PREEMPT "DB_LUS" "SHARED_LUS" [CHECK_INTERVAL LEASE]: NODE's configuration:
# resource "db" (exclusive) on DB_LUS and "logs" (shared) on SHARED_LUS, by NODE's sg paths.
bf_config() {
  local node=$1 id=$2 preempt=$3 db_lus=$4 shared_lus=$5 interval=${6:-500ms} lease=${7:-3s}
  local dir=$BF/$node devices lu
  mkdir -p "$dir/state" "$dir/run"
  devices=""
  for lu in $db_lus; do devices+="\"$(lab_dev "$node" "$lu" sg)\", "; done
  cat >"$dir/blkfence.toml" <<TOML
cluster = "lab"
node_id = $id
state_dir = "$dir/state"
run_dir = "$dir/run"

[[resource]]
name = "db"
devices = [${devices%, }]
preempt = "$preempt"
check_interval = "$interval"
lease = "$lease"
command_timeout = "2s"
on_fenced = ["/bin/sh", "-c", "echo \$BLKFENCE_REASON \$BLKFENCE_KEY >> $dir/on_fenced"]
TOML
  if [[ -n $shared_lus ]]; then
    devices=""
    for lu in $shared_lus; do devices+="\"$(lab_dev "$node" "$lu" sg)\", "; done
    cat >>"$dir/blkfence.toml" <<TOML

[[resource]]
name = "logs"
devices = [${devices%, }]
mode = "shared"
preempt = "$preempt"
check_interval = "$interval"
lease = "$lease"
command_timeout = "2s"
on_fenced = "none"
TOML
  fi
}

# bf_start NODE [BINARY]: starts NODE's daemon and waits until every resource's state is known.
bf_start() {
  local node=$1 binary=${2:-$BLKFENCED} try
  "$binary" --config "$BF/$node/blkfence.toml" --log stderr >>"$BF/$node/log" 2>&1 &
  echo $! >"$BF/$node/pid"
  for ((try = 0; try < 200; try++)); do
    if bf_ctl "$node" status --json 2>/dev/null | grep -q '"state"' &&
      ! bf_ctl "$node" status --json 2>/dev/null | grep -q '"state": "unknown"'; then
      return 0
    fi
    kill -0 "$(cat "$BF/$node/pid")" 2>/dev/null || { echo "blkfenced $node died:"; tail -5 "$BF/$node/log"; return 1; }
    sleep 0.1
  done
  echo "blkfenced $node did not become ready"; tail -5 "$BF/$node/log"
  return 1
}

# bf_alive PID: the process exists and has not exited (a zombie waiting for its parent has).
bf_alive() {
  local state
  read -r _ _ state _ 2>/dev/null <"/proc/$1/stat" && [[ $state != Z ]]
}

# bf_stop NODE: SIGTERM, then wait until the process is gone (SIGKILL after 10 s). A daemon that
# bf_start started inside $(...) (lab_expect does) is not this shell's child, so `wait` alone
# would return at once, with the daemon still running.
bf_stop() {
  local pid try
  pid=$(cat "$BF/$1/pid") || return 0
  kill -TERM "$pid" 2>/dev/null
  for ((try = 0; try < 100; try++)); do
    bf_alive "$pid" || break
    sleep 0.1
  done
  if bf_alive "$pid"; then
    echo "bf_stop: blkfenced $1 (pid $pid) still runs 10 s after SIGTERM; killing it" >&2
    kill -KILL "$pid" 2>/dev/null
    for ((try = 0; try < 50; try++)); do
      bf_alive "$pid" || break
      sleep 0.1
    done
  fi
  wait "$pid" 2>/dev/null
  return 0
}

# bf_field NODE RESOURCE FIELD: one field of the resource's status (state, gate_open, key, epoch,
# fenced_by), as blkfencectl status --json prints it.
bf_field() {
  bf_ctl "$1" status "$2" --json | python3 -c '
import json, sys
status = json.load(sys.stdin)["resources"][0]
value = status.get(sys.argv[1])
print("null" if value is None else (str(value).lower() if isinstance(value, bool) else value))' "$3"
}

# bf_await NODE RESOURCE FIELD VALUE [TRIES]: waits (polling status) until FIELD is VALUE.
bf_await() {
  local node=$1 resource=$2 field=$3 want=$4 tries=${5:-150} got try
  for ((try = 0; try < tries; try++)); do
    got=$(bf_field "$node" "$resource" "$field" 2>/dev/null)
    [[ $got == "$want" ]] && return 0
    sleep 0.1
  done
  echo "bf_await: $node $resource $field is '$got', not '$want'"
  return 1
}

# bf_checks NODE RESOURCE: how many monitor rounds the daemon has finished (its metrics).
bf_checks() {
  bf_ctl "$1" metrics | awk -v r="$2" '$1 == "blkfence_check_latency_seconds_count{resource=\"" r "\"}" { print $2 }'
}

# bf_await_checks NODE RESOURCE N: waits until N more monitor rounds have finished.
bf_await_checks() {
  local start now try
  start=$(bf_checks "$1" "$2")
  for ((try = 0; try < 300; try++)); do
    now=$(bf_checks "$1" "$2")
    ((now >= start + $3)) && return 0
    sleep 0.1
  done
  echo "bf_await_checks: $1 $2 did not finish $3 more checks"
  return 1
}

# bf_clear LU...: removes every registration and reservation (through node A's first path).
bf_clear() {
  local lu dev
  for lu in "$@"; do
    dev=$(lab_dev A "$lu" sg)
    lab_pr --out --register-ignore --param-sark=0x1 "$dev" >/dev/null 2>&1
    lab_pr --out --clear --param-rk=0x1 "$dev" >/dev/null 2>&1
  done
}

# bf_holders_everywhere LU...: the holders of every LU (read through node B), one sorted line.
bf_holders_everywhere() {
  local lu
  for lu in "$@"; do lab_holder "$(lab_dev B "$lu")" | awk '{print $1}'; done | sort -u | tr '\n' ' '
}

# bf_keys_everywhere LU...: the registered keys of every LU (read through node B), one sorted line.
bf_keys_everywhere() {
  local lu
  for lu in "$@"; do lab_keys "$(lab_dev B "$lu")"; done | sort -u | tr '\n' ' '
}

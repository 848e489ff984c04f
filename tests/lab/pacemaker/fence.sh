#!/bin/bash
# Pacemaker fences node B through fence_blkfence on real LIO (issue 13; integrations/pacemaker),
# then through fence_scsi configured the same way on the same LUs, and prints the time of each:
#   1. node A's and node B's blkfenced each hold a shared-mode resource over the LUs (A's and B's
#      own sg paths), both unfenced (B first, so B holds the reservation, and A's fence preempts
#      the holder);
#   2. a two-node Pacemaker cluster, nodeA and nodeB, in the one guest (no init system: corosync
#      and pacemakerd are started here in the background). Two stacks cannot share a network
#      namespace (corosync binds its address; libqb's IPC sockets are abstract, one set per
#      network namespace) nor /etc/corosync, /var/lib/pacemaker, /var/log/pacemaker, /run: each
#      node gets its own network, mount and UTS namespaces (unshare, held by a sleeping process;
#      clients enter them with nsenter), its own directories bound on those paths, a tmpfs on /run
#      and /dev/shm, and its blkfenced's run dir bound on /run/blkfence; a veth pair with private
#      addresses carries corosync (knet) between them. Plain namespaces rather than
#      systemd-nspawn: the guest's PID 1 is no systemd, and nothing else needs isolating. Quorum is
#      votequorum's two_node, so nodeA stays quorate when nodeB's stack stops, and a node is
#      quorate only once it has seen the other (no start-up fencing). One stonith resource,
#      fence_blkfence with nodes=nodeA:1,nodeB:2 and no socket: each node's fencer runs the agent
#      against its own node's blkfenced at the default socket, which tells the agent which node it
#      runs on (checked: node id 1 on nodeA, 2 on nodeB; crm_node -n names each node);
#   3. `stonith_admin --fence nodeB` on nodeA succeeds (it runs on nodeA, the fencer's history
#      says); B's key is on none of the LUs (read by sg_persist), A's on every one; B's write is
#      refused by the target; B's daemon reports fenced. nodeB's controller, told that nodeB was
#      fenced, exits ("We were allegedly just fenced"), and its pacemakerd stops nodeB's whole
#      stack, corosync included (fence-reaction=stop): the check awaits both.
#      `stonith_admin --fence nodeA` (nodeA alone in the cluster now): Pacemaker runs the agent
#      on nodeA, which refuses; it fails and A's key stays;
#   4. nodeB's stack starts again, as after a reboot, and rejoins; B stays fenced (the device has no
#      provides=unfencing yet); `stonith_admin --unfence nodeB` on nodeA succeeds: nodeB's fencer
#      runs the agent's on (on_target), B's key is on every LU again and B writes. Then automatic
#      unfencing: the device gets the meta attribute provides=unfencing, nodeB is fenced again
#      and restarted, and the cluster unfences it as it joins (the scheduler orders unfencing
#      before the device's probe on a node not unfenced since its fence): B's key is back on every
#      LU with nobody calling the agent, and the fencer's history shows the unfencing asked by
#      the controller and run on nodeB. nodeB's stack stops for what follows;
#   5. device mode: the daemons stop (their keys stay), and a fence_blkfence resource with
#      cluster and A's devices (nodeA alone runs it), whose socket nobody answers, fences nodeB
#      with blkfencectl device (PREEMPT of B's key, the key blkfenced registered); B's key
#      gone, B's write refused; the agent's on as B's fencer would run it (local_node=nodeB, B's
#      devices) registers B again;
#   6. with `compare` only (lab.fence_compare, label lab-full: about two more minutes under TCG,
#      spent measuring fence_scsi, not testing blkfence), the same with fence_scsi (no daemons:
#      its registrations are its own, key_value=hash):
#      B registered with `fence_scsi -o on` on nodeB (fence_scsi reads the cluster name from
#      corosync, so nodeB's corosync runs again), then A on nodeA; `stonith_admin --fence nodeB`
#      through a fence_scsi resource on A's paths; B's key gone from every LU; B registered again
#      by fence_scsi's on, run on nodeB as its fencer runs it.
# fence_scsi always sends PREEMPT AND ABORT, which deadlocks LIO over tcm_loop on Linux 6.1
# (tests/lab/README.md, "Limits"), so its sg_persist is a wrapper that sends PREEMPT instead, as
# blkfenced's resource does here (preempt = "preempt"): the same commands otherwise, one process
# per LU and command. No timing is asserted; the times are printed, and kept in
# $BLKFENCE_LAB_OUT/pacemaker-times; each node's logs go to pacemaker-nodeN.log and
# corosync-nodeN.log there.
#   usage: fence.sh FIRST_LU COUNT [compare]    e.g. fence.sh 16 16
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
usage="usage: fence.sh FIRST_LU COUNT [compare]"
first=${1:?$usage} count=${2:?$usage} compare=${3:-}
[[ -z $compare || $compare == compare ]] || { echo "fence.sh: '$compare'? $usage" >&2; exit 2; }
lus=$(seq "$first" $((first + count - 1)) | tr '\n' ' ')
agent_src=$BLKFENCE_LAB_REPO/integrations/pacemaker/fence_blkfence
pcmk=/tmp/pcmk
times=$BLKFENCE_LAB_OUT/pacemaker-times
mkdir -p "$pcmk"
: >"$times"

elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
devs_of() {  # devs_of NODE FIELD SEPARATOR: NODE's device of every LU, joined
  local lu out=""
  for lu in $lus; do out+=$(lab_dev "$1" "$lu" "$2")$3; done
  printf '%s' "${out%"$3"}"
}

# pf_config NODE NODE_ID: NODE's blkfenced with one shared-mode resource over the LUs.
pf_config() {
  local node=$1 dir=$BF/$1
  mkdir -p "$dir/state" "$dir/run"
  cat >"$dir/blkfence.toml" <<TOML
cluster = "lab"
node_id = $2
state_dir = "$dir/state"
run_dir = "$dir/run"

[[resource]]
name = "shared"
devices = [$(devs_of "$node" sg ', ' | sed 's/[^ ,][^ ,]*/"&"/g')]
mode = "shared"
preempt = "preempt"
check_interval = "500ms"
lease = "3s"
command_timeout = "2s"
on_fenced = "none"
TOML
}

# registrations_everywhere: how many registrations each LU has, sorted and unique ("2 " when
# every LU has two); fails when a LU cannot be read.
registrations_everywhere() {
  local lu keys all=""
  for lu in $lus; do
    keys=$(lab_keys "$(lab_dev B "$lu")") || return 1
    all+=$(grep -c . <<<"$keys")$'\n'
  done
  printf '%s' "$all" | sort -u | tr '\n' ' '
}

# --- Pacemaker: nodeA and nodeB --------------------------------------------------------------------
# Each node's corosync and Pacemaker run in the node's own network, mount and UTS namespaces, held
# by a sleeping process ($pcmk/NODE/ns.pid): corosync binds its address, libqb's IPC sockets are
# abstract (one set per network namespace), and each node has its own /etc/corosync,
# /var/lib/corosync, /var/lib/pacemaker, /var/log/pacemaker, /run and /dev/shm, bound from
# $pcmk/NODE. Node N's blkfenced run dir is bound on /run/blkfence there, so each node's fencer
# finds its own node's daemon at the default socket. A veth pair joins the two network namespaces.
pcmk_net=10.213.0  # nodeA is .1, nodeB .2

# on_node NODE COMMAND...: COMMAND in NODE's namespaces (its cluster's IPC, its mounts, its name).
on_node() {
  local node=$1
  shift
  nsenter --target "$(cat "$pcmk/$node/ns.pid")" --net --mount --uts -- "$@"
}

# node_corosync_conf NODE: the same nodelist on both nodes; corosync finds its own node by the
# address. two_node: nodeA stays quorate when nodeB's stack stops (its implied wait_for_all makes
# a node quorate only once it has seen the other, which also keeps the first start from fencing).
node_corosync_conf() {
  cat >"$pcmk/$1/etc-corosync/corosync.conf" <<CONF
totem {
  version: 2
  cluster_name: lab
  crypto_cipher: none
  crypto_hash: none
}
logging {
  to_stderr: no
  to_syslog: no
  to_logfile: yes
  logfile: $pcmk/$1/corosync.log
}
quorum {
  provider: corosync_votequorum
  two_node: 1
}
nodelist {
  node {
    name: nodeA
    nodeid: 1
    ring0_addr: $pcmk_net.1
  }
  node {
    name: nodeB
    nodeid: 2
    ring0_addr: $pcmk_net.2
  }
}
CONF
}

# node_create NODE: NODE's namespaces and directories, bound on the standard paths there.
node_create() {
  local node=$1 dir=$pcmk/$1 pid try
  mkdir -p "$dir/etc-corosync" "$dir/lib-corosync" "$dir/log" \
    "$dir"/lib-pacemaker/{cib,pengine,blackbox,cores}
  chown -R hacluster:haclient "$dir/lib-pacemaker" "$dir/log"
  chmod 750 "$dir"/lib-pacemaker/*
  chmod 770 "$dir/log"
  node_corosync_conf "$node"
  unshare --net --mount --uts --propagation private sleep infinity </dev/null >/dev/null 2>&1 &
  pid=$!
  echo "$pid" >"$dir/ns.pid"
  # unshare execs sleep once the namespaces exist: until then nsenter would enter this shell's.
  for ((try = 0; try < 100; try++)); do
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == sleep ]] && break
    sleep 0.1
  done
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == sleep ]] || { echo "node$node's namespaces are not made"; return 1; }
  on_node "$node" sh -ec '
    hostname "node$1"
    mount -t tmpfs -o mode=755 tmpfs /run
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm
    mkdir /run/blkfence
    mount --bind "$2" /run/blkfence
    mount --bind "$3/etc-corosync" /etc/corosync
    mount --bind "$3/lib-corosync" /var/lib/corosync
    mount --bind "$3/lib-pacemaker" /var/lib/pacemaker
    mount --bind "$3/log" /var/log/pacemaker
    ip link set lo up' sh "$node" "$BF/$node/run" "$dir"
}

# nodes_link: the veth pair between the two nodes' network namespaces, with their addresses.
nodes_link() {
  modprobe veth &&
    ip link add pcmkA type veth peer name pcmkB &&
    ip link set pcmkA netns "$(cat "$pcmk/A/ns.pid")" &&
    ip link set pcmkB netns "$(cat "$pcmk/B/ns.pid")" &&
    on_node A sh -ec "ip addr add $pcmk_net.1/24 dev pcmkA; ip link set pcmkA up" &&
    on_node B sh -ec "ip addr add $pcmk_net.2/24 dev pcmkB; ip link set pcmkB up"
}

# corosync_start NODE, pacemaker_start NODE: in the background, in NODE's namespaces (nsenter execs
# the daemon, so the pid is the daemon's).
corosync_start() {
  nsenter --target "$(cat "$pcmk/$1/ns.pid")" --net --mount --uts -- \
    corosync -f </dev/null >>"$pcmk/$1/corosync.out" 2>&1 &
  echo $! >"$pcmk/$1/corosync.pid"
}
pacemaker_start() {
  nsenter --target "$(cat "$pcmk/$1/ns.pid")" --net --mount --uts -- \
    env PCMK_logfile=/var/log/pacemaker/pacemaker.log pacemakerd </dev/null >>"$pcmk/$1/pacemakerd.out" 2>&1 &
  echo $! >"$pcmk/$1/pacemakerd.pid"
}

# await_quorate NODE: until NODE's corosync says it is quorate (120 s at most). Every client call
# is bounded (timeout): a client of a daemon still starting may wait for ever.
await_quorate() {
  local end=$((SECONDS + 120)) quorum=""
  while ((SECONDS < end)); do
    # corosync-quorumtool exits 0 even when it cannot reach corosync yet: read what it says.
    quorum=$(on_node "$1" timeout 5 corosync-quorumtool -s 2>&1)
    [[ $quorum == *"Quorate:"*"Yes"* ]] && return 0
    sleep 0.5
  done
  echo "node$1's corosync is not quorate after 120 s: $quorum"
  return 1
}
# await_cib NODE: until NODE's CIB answers (120 s at most).
await_cib() {
  local end=$((SECONDS + 120))
  while ((SECONDS < end)); do
    on_node "$1" timeout 5 cibadmin -Q >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "node$1's CIB does not answer after 120 s:"
  tail -5 "$pcmk/$1/log/pacemaker.log"
  return 1
}

# await_controller NODE: until NODE's controller answers (120 s at most). pacemakerd starts the CIB
# first and the controller after it; crm_node and the scheduler's work need the controller.
await_controller() {
  local end=$((SECONDS + 120)) out=""
  while ((SECONDS < end)); do
    out=$(on_node "$1" timeout 5 crm_node -n 2>&1) && return 0
    sleep 0.5
  done
  echo "node$1's controller does not answer after 120 s: $out"
  return 1
}

# await_gone PID SECONDS: until the process has exited.
await_gone() {
  local try
  for ((try = 0; try < $2 * 10; try++)); do
    bf_alive "$1" || return 0
    sleep 0.1
  done
  echo "process $1 ($(cat "/proc/$1/comm" 2>/dev/null)) still runs after $2 s"
  return 1
}
# stop_pid PID: SIGTERM, SIGKILL after 120 s (pacemakerd stops its daemons one by one first).
stop_pid() {
  kill -TERM "$1" 2>/dev/null
  await_gone "$1" 120 >/dev/null || kill -KILL "$1" 2>/dev/null
  return 0
}

# node_start NODE: corosync, quorate (it has seen the other node), then pacemakerd, its CIB and its
# controller.
node_start() {
  corosync_start "$1" && await_quorate "$1" && pacemaker_start "$1" && await_cib "$1" && await_controller "$1"
}
# node_stop NODE: NODE's stack, Pacemaker first, as a shutdown stops it.
node_stop() {
  local pid
  for pid in $(cat "$pcmk/$1/pacemakerd.pid" "$pcmk/$1/corosync.pid" 2>/dev/null); do
    stop_pid "$pid"
  done
  rm -f "$pcmk/$1/pacemakerd.pid" "$pcmk/$1/corosync.pid"
}

pcmk_stop() {
  local node
  for node in B A; do
    [[ -f $pcmk/$node/ns.pid ]] || continue
    node_stop "$node"
    kill -KILL "$(cat "$pcmk/$node/ns.pid")" 2>/dev/null
    cp "$pcmk/$node/log/pacemaker.log" "$BLKFENCE_LAB_OUT/pacemaker-node$node.log" 2>/dev/null
    cp "$pcmk/$node/corosync.log" "$BLKFENCE_LAB_OUT/corosync-node$node.log" 2>/dev/null
  done
  return 0
}
trap 'pcmk_stop; bf_save_logs' EXIT

# stonith_registered NODE DEVICE: NODE's fencer lists DEVICE (yes) or not (no).
stonith_registered() {
  local list
  list=$(on_node "$1" timeout 10 stonith_admin --list-registered 2>&1) ||
    { echo "node$1: stonith_admin --list-registered failed: $list" >&2; return 1; }
  [[ $list == *"$2"* ]] && echo yes || echo no
}
# await_registered NODE DEVICE yes|no: until NODE's fencer has (or no longer has) DEVICE; 120 s
# at most.
await_registered() {
  local end=$((SECONDS + 120)) got
  while ((SECONDS < end)); do
    got=$(stonith_registered "$1" "$2") && [[ $got == "$3" ]] && return 0
    sleep 0.1
  done
  echo "node$1's fencer's devices: $(on_node "$1" timeout 10 stonith_admin --list-registered 2>&1 | tr '\n' ' ')"
  return 1
}
# stonith_create ID AGENT NAME=VALUE...: a stonith resource in the CIB (through nodeA).
stonith_create() {
  local id=$1 agent=$2 nv xml
  shift 2
  xml="<primitive id=\"$id\" class=\"stonith\" type=\"$agent\"><instance_attributes id=\"$id-ia\">"
  for nv in "$@"; do
    xml+="<nvpair id=\"$id-${nv%%=*}\" name=\"${nv%%=*}\" value=\"${nv#*=}\"/>"
  done
  on_node A timeout 30 cibadmin -C -o resources -X "$xml</instance_attributes></primitive>"
}
# stonith_delete ID: the stonith resource out of the CIB.
stonith_delete() { on_node A timeout 30 cibadmin -D -o resources -X "<primitive id=\"$1\"/>"; }

# daemon_node_id NODE: the node id of the blkfenced answering at the default socket in NODE's
# namespaces (what fence_blkfence, run there by NODE's fencer, takes for "this node").
daemon_node_id() {
  on_node "$1" "$BLKFENCECTL" status --json |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["node"])'
}
# history_has NODE TEXT: the fencer's history of nodeB, read on NODE, holds TEXT.
history_has() {
  local history
  history=$(on_node "$1" timeout 30 stonith_admin --history nodeB --verbose 2>&1) || { echo "$history"; return 1; }
  [[ $history == *"$2"* ]] || { echo "no '$2' in: $history"; return 1; }
}

# both FUNCTION: FUNCTION A, then FUNCTION B.
both() { "$1" A && "$1" B; }
# list_targets DEVICE: the nodes nodeA's fencer says DEVICE can fence, sorted, on one line.
list_targets() {
  local list
  list=$(on_node A timeout 60 stonith_admin --list-targets "$1") || return 1
  grep -v "targets found" <<<"$list" | sort | tr '\n' ' ' | sed 's/ $//'
}

# await_keys WANT: until the keys on the LUs are WANT (bf_keys_everywhere); 120 s at most.
await_keys() {
  local end=$((SECONDS + 120)) got
  while ((SECONDS < end)); do
    got=$(bf_keys_everywhere $lus 2>&1) && [[ $got == "$1" ]] && return 0
    sleep 0.5
  done
  echo "the keys are '$got', not '$1'"
  return 1
}
# record WHAT START: the seconds since START, logged and kept in the times file.
record() {
  local took
  took=$(elapsed "$2")
  lab_log "$1: $took s"
  printf '%s\t%s\t0\n' "$1" "$took" >>"$times"
}

# fence_timed WHAT stonith_admin ARGS...: runs it, logs and records its time, returns its status.
fence_timed() {
  local what=$1 start rc took
  shift
  start=$EPOCHREALTIME
  "$@" >"$pcmk/last.out" 2>&1
  rc=$?
  took=$(elapsed "$start")
  lab_log "$what: exit $rc in $took s: $(tr '\n' ' ' <"$pcmk/last.out")"
  printf '%s\t%s\t%s\n' "$what" "$took" "$rc" >>"$times"
  return "$rc"
}

# --- 1. two blkfenced, shared mode ----------------------------------------------------------------
rm -rf "$BF"
lab_expect "the $count LUs are cleared first" bf_clear $lus
pf_config A 1
pf_config B 2
lab_expect "A's daemon starts" bf_start A
lab_expect "B's daemon starts" bf_start B
lab_expect "B unfences (and reserves)" bf_ctl B unfence shared --timeout 30s
lab_expect "A unfences" bf_ctl A unfence shared --timeout 30s
key_a=$(bf_field A shared key) key_b=$(bf_field B shared key)
lab_expect "A's key is a key ('$key_a')" lab_is_key "$key_a"
lab_expect "B's key is a key ('$key_b')" lab_is_key "$key_b"
lab_expect_read "A's and B's keys are on every LU" "$(printf '%s\n' "$key_a" "$key_b" | sort | tr '\n' ' ')" \
  bf_keys_everywhere $lus

# --- 2. Pacemaker with fence_blkfence, two nodes -------------------------------------------------
# Pacemaker looks for fence agents in /usr/sbin (the guest's overlay, not the host's).
cp "$agent_src" /usr/sbin/fence_blkfence
start=$EPOCHREALTIME
lab_expect "nodeA's namespaces are made, its directories bound" node_create A
lab_expect "nodeB's namespaces are made, its directories bound" node_create B
lab_expect "a veth pair joins them ($pcmk_net.1, $pcmk_net.2)" nodes_link
lab_expect_read "on nodeA, /run/blkfence/control.sock is A's blkfenced (node id 1)" 1 daemon_node_id A
lab_expect_read "on nodeB, /run/blkfence/control.sock is B's blkfenced (node id 2)" 2 daemon_node_id B
lab_expect "corosync starts on nodeA and nodeB" both corosync_start
lab_expect "nodeA is quorate (it sees nodeB: two_node waits for all)" await_quorate A
lab_expect "nodeB is quorate" await_quorate B
lab_expect "pacemakerd starts on nodeA and nodeB" both pacemaker_start
lab_expect "nodeA's CIB answers" await_cib A
lab_expect "nodeB's CIB answers" await_cib B
record "pacemaker start, two nodes (both CIBs answer)" "$start"
lab_expect "nodeA's controller answers" await_controller A
lab_expect "nodeB's controller answers" await_controller B
lab_expect_read "nodeA's Pacemaker knows itself as nodeA" nodeA on_node A timeout 10 crm_node -n
lab_expect_read "nodeB's Pacemaker knows itself as nodeB" nodeB on_node B timeout 10 crm_node -n
lab_expect "stonith-enabled set" on_node A timeout 30 crm_attribute -t crm_config -n stonith-enabled -v true
# One resource for both nodes, without a socket: each node's fencer runs the agent against its own
# node's blkfenced at the default socket, as on a cluster of real nodes.
lab_expect "the fence_blkfence stonith resource is created" stonith_create blkfence fence_blkfence \
  "nodes=nodeA:1,nodeB:2" "resource=shared" "blkfencectl_path=$BLKFENCECTL" "pcmk_off_timeout=120s"
lab_expect "nodeA's fencer registers it" await_registered A blkfence yes
lab_expect "nodeB's fencer registers it" await_registered B blkfence yes
record "pacemaker start to fence_blkfence registered on both nodes" "$start"
lab_expect "validate-all through nodeA's fencer (stonith_admin --validate) passes" \
  on_node A timeout 60 stonith_admin --validate --agent fence_blkfence --option "nodes=nodeA:1,nodeB:2" \
  --option resource=shared --option "blkfencectl_path=$BLKFENCECTL"
lab_expect_read "Pacemaker learns the targets from the agent's list" "nodeA nodeB" list_targets blkfence

# --- 3. fence nodeB --------------------------------------------------------------------------------
b_pacemakerd=$(cat "$pcmk/B/pacemakerd.pid") b_corosync=$(cat "$pcmk/B/corosync.pid")
fence_timed "fence_blkfence: stonith_admin --fence nodeB ($count LUs)" on_node A stonith_admin --fence nodeB --timeout 120
lab_expect_eq "stonith_admin --fence nodeB (on nodeA) succeeds" "$?" 0
lab_expect_read "B's key is on none of the $count LUs, A's on every one (sg_persist)" "$key_a " bf_keys_everywhere $lus
b_dev=$(lab_dev B "$first")
lab_expect_eq "B's write is refused by the target" "$(lab_write "$b_dev" 100 "B after the fence")" "Invalid exchange"
lab_expect "B's daemon reports fenced" bf_await B shared state fenced
lab_expect "the fence ran on nodeA (the fencer's history)" history_has A "delegate=nodeA"
# Told that it was fenced, a node's controller exits, and pacemakerd stops the node's stack with it,
# corosync included.
lab_expect "nodeB's Pacemaker, told that nodeB was fenced, stops itself" await_gone "$b_pacemakerd" 120
lab_expect "nodeB's log says why" grep -q "We were allegedly just fenced" "$pcmk/B/log/pacemaker.log"
lab_expect "nodeB's corosync stops with it" await_gone "$b_corosync" 60
# nodeB is out of the cluster: only nodeA's fencer can run the device, on nodeA itself.
fence_timed "fence_blkfence: stonith_admin --fence nodeA (this node)" on_node A stonith_admin --fence nodeA --timeout 30
lab_expect "stonith_admin --fence nodeA (this node) fails" test "$?" -ne 0
lab_expect_read "A's key is still on every LU (nothing fenced A)" "$key_a " bf_keys_everywhere $lus

# --- 4. unfence nodeB: by stonith_admin, then by the cluster itself ---------------------------------
start=$EPOCHREALTIME
lab_expect "nodeB's stack starts again (nodeB rejoins, as after a reboot)" node_start B
lab_expect "nodeB's fencer registers the device" await_registered B blkfence yes
record "nodeB's restart to its fencer having the device" "$start"
lab_expect_read "B is still fenced: without provides=unfencing nothing unfences it" "$key_a " bf_keys_everywhere $lus
fence_timed "fence_blkfence: stonith_admin --unfence nodeB ($count LUs)" on_node A stonith_admin --unfence nodeB --timeout 60
lab_expect_eq "stonith_admin --unfence nodeB (on nodeA) succeeds" "$?" 0
lab_expect_read "A's and B's keys are on every LU again" "$(printf '%s\n' "$key_a" "$key_b" | sort | tr '\n' ' ')" bf_keys_everywhere $lus
lab_expect "B writes again" lab_write "$b_dev" 100 "B after the unfence"
lab_expect "the unfencing ran on nodeB (the fencer's history)" history_has A "unfencing of nodeB successful: delegate=nodeB"

# Automatic unfencing: with provides=unfencing, the scheduler unfences a node before it probes the
# device there, which it does whenever the node joins after a fence (the fence wiped its history).
lab_expect "the device gets provides=unfencing" on_node A timeout 30 crm_resource --resource blkfence \
  --meta --set-parameter provides --parameter-value unfencing
b_pacemakerd=$(cat "$pcmk/B/pacemakerd.pid") b_corosync=$(cat "$pcmk/B/corosync.pid")
fence_timed "fence_blkfence: stonith_admin --fence nodeB, provides=unfencing ($count LUs)" \
  on_node A stonith_admin --fence nodeB --timeout 120
lab_expect_eq "stonith_admin --fence nodeB succeeds again" "$?" 0
lab_expect_read "B's key is on none of the LUs again" "$key_a " bf_keys_everywhere $lus
lab_expect "nodeB's Pacemaker stops itself again" await_gone "$b_pacemakerd" 120
lab_expect "nodeB's corosync stops with it" await_gone "$b_corosync" 60
start=$EPOCHREALTIME
lab_expect "nodeB's stack starts again" node_start B
lab_expect "the cluster unfences nodeB as it joins: A's and B's keys on every LU" await_keys "$(printf '%s\n' "$key_a" "$key_b" | sort | tr '\n' ' ')"
record "automatic unfencing: nodeB's start to B's key on every LU ($count LUs)" "$start"
lab_expect "the cluster's controller asked for it, and it ran on nodeB (the fencer's history)" \
  history_has A "unfencing of nodeB successful: delegate=nodeB, client=pacemaker-controld"
lab_expect "B writes again after the automatic unfencing" lab_write "$b_dev" 100 "B after the cluster unfenced it"

# Device mode and fence_scsi name nodeA's paths: nodeA alone runs them, nodeB's stack stopped.
lab_expect "nodeB's stack stops" node_stop B
lab_expect "the fence_blkfence resource is deleted" stonith_delete blkfence
lab_expect "the fencer drops it" await_registered A blkfence no
bf_stop A
bf_stop B

# --- 5. device mode: no blkfenced ------------------------------------------------------------------
# The daemons stop (their keys stay registered); the agent finds nobody on its socket and sends the
# PR commands itself with blkfencectl device, on A's paths, with the keys blkfenced would use.
lab_expect "the fence_blkfence resource in device mode is created" stonith_create blkfence-dev fence_blkfence \
  "nodes=nodeA:1,nodeB:2" "cluster=lab" "devices=$(devs_of A sd ,)" "preempt=preempt" \
  "socket=$BF/none.sock" "blkfencectl_path=$BLKFENCECTL" "pcmk_off_timeout=120s"
lab_expect "the fencer registers it" await_registered A blkfence-dev yes
fence_timed "fence_blkfence (device mode): stonith_admin --fence nodeB ($count LUs)" \
  on_node A stonith_admin --fence nodeB --timeout 120
lab_expect_eq "stonith_admin --fence nodeB in device mode succeeds" "$?" 0
lab_expect_read "device mode: B's key is on none of the $count LUs, A's on every one" "$key_a " bf_keys_everywhere $lus
lab_expect_eq "device mode: B's write is refused by the target" "$(lab_write "$b_dev" 100 "B after the fence")" "Invalid exchange"
fence_timed "fence_blkfence (device mode): on as nodeB's fencer runs it ($count LUs)" \
  sh -c 'printf "%s\n" action=on port=nodeB nodename=nodeB "nodes=nodeA:1,nodeB:2" cluster=lab \
    local_node=nodeB "devices=$1" "socket=$2" "blkfencectl_path=$3" | /usr/sbin/fence_blkfence' \
  sh "$(devs_of B sd ,)" "$BF/none.sock" "$BLKFENCECTL"
lab_expect_eq "device mode: the agent's on for nodeB succeeds" "$?" 0
lab_expect_read "device mode: A's and B's keys are on every LU again" \
  "$(printf '%s\n' "$key_a" "$key_b" | sort | tr '\n' ' ')" bf_keys_everywhere $lus
lab_expect "the device-mode resource is deleted" stonith_delete blkfence-dev
lab_expect "the fencer drops it" await_registered A blkfence-dev no

# --- 6. the same with fence_scsi -------------------------------------------------------------------
if [[ $compare != compare ]]; then
  lab_log "times (seconds, exit status):"
  column -t -s $'\t' "$times"
  lab_done
  exit
fi
cat >"$pcmk/sg_persist" <<'WRAPPER'
#!/bin/bash
# fence_scsi's sg_persist in the lab: PREEMPT (-P) where fence_scsi asks PREEMPT AND ABORT (-A),
# which deadlocks LIO over tcm_loop on Linux 6.1.
args=()
for arg in "$@"; do [[ $arg == -A ]] && arg=-P; args+=("$arg"); done
exec /usr/bin/sg_persist "${args[@]}"
WRAPPER
chmod +x "$pcmk/sg_persist"
lab_expect "the $count LUs are cleared" bf_clear $lus
# fence_scsi reads the cluster's name from corosync (corosync-cmapctl) for its keys: nodeB's
# corosync runs again for nodeB's on (its Pacemaker need not). Its key and device files are under
# each node's own /run.
lab_expect "nodeB's corosync starts again" corosync_start B
lab_expect "nodeB is quorate" await_quorate B
a_devs=$(devs_of A sd ,) b_devs=$(devs_of B sd ,)
scsi_on() {  # scsi_on NODE DEVICES: fence_scsi's on, as NODE's fencer runs it (on NODE)
  printf '%s\n' action=on "port=node$1" "nodename=node$1" "devices=$2" key_value=hash \
    "sg_persist_path=$pcmk/sg_persist" | on_node "$1" fence_scsi
}
lab_expect "fence_scsi: B registers (on, on nodeB)" scsi_on B "$b_devs"
lab_expect "fence_scsi: A registers (on, on nodeA)" scsi_on A "$a_devs"
scsi_a=0x$(on_node A cat /run/cluster.key)
lab_expect "fence_scsi: A's key is a key ('$scsi_a')" lab_is_key "$scsi_a"
lab_expect "the fence_scsi stonith resource is created" stonith_create scsi fence_scsi \
  "devices=$a_devs" key_value=hash "sg_persist_path=$pcmk/sg_persist" "pcmk_host_list=nodeA nodeB" \
  "pcmk_off_timeout=300s"
lab_expect "the fencer registers it" await_registered A scsi yes
fence_timed "fence_scsi: stonith_admin --fence nodeB ($count LUs)" on_node A stonith_admin --fence nodeB --timeout 300
lab_expect_eq "stonith_admin --fence nodeB through fence_scsi succeeds" "$?" 0
lab_expect_read "fence_scsi: only A's key is left on the $count LUs" "$scsi_a " bf_keys_everywhere $lus
fence_timed "fence_scsi: on as nodeB's fencer runs it ($count LUs)" scsi_on B "$b_devs"
lab_expect_read "fence_scsi: A and B are registered again on every LU" "2 " registrations_everywhere

lab_log "times (seconds, exit status):"
column -t -s $'\t' "$times"
lab_done

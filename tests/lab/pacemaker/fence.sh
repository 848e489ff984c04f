#!/bin/bash
# Pacemaker fences node B through fence_blkfence on real LIO (issue 13; integrations/pacemaker),
# then through fence_scsi configured the same way on the same LUs, and prints the time of each:
#   1. node A's and node B's blkfenced each hold a shared-mode resource over the LUs (A's and B's
#      own sg paths), both unfenced (B first, so B holds the reservation, and A's fence preempts
#      the holder);
#   2. a one-node Pacemaker cluster (corosync and pacemakerd started here in the background, as
#      the guest runs no init system; node name nodeA, stonith-enabled) gets a stonith resource
#      fence_blkfence with nodes=nodeA:1,nodeB:2 and A's socket (shared mode);
#   3. `stonith_admin --fence nodeB` succeeds; B's key is on none of the LUs (read by sg_persist),
#      A's is on every one; B's write is refused by the target; B's daemon reports fenced.
#      `stonith_admin --fence nodeA` (this node): Pacemaker runs the agent, which refuses; it fails
#      and A's key stays;
#   4. `stonith_admin --unfence nodeB` in this one-node cluster: unfencing runs on the target
#      (on_target), and nodeB is no member here, so Pacemaker has nobody to run it and it fails;
#      the check then runs the agent's on as nodeB's fencer would (stdin parameters, B's socket):
#      B is registered on every LU again and writes;
#   5. device mode: the daemons stop (their keys stay), and a fence_blkfence resource with
#      cluster and A's devices, whose socket nobody answers, fences nodeB with blkfencectl device
#      (PREEMPT of B's key, the key blkfenced registered); B's key gone, B's write refused; the
#      agent's on as B's fencer would run it (local_node=nodeB, B's devices) registers B again;
#   6. with `compare` only (lab.fence_compare, label lab-full: about two more minutes under TCG,
#      spent measuring fence_scsi, not testing blkfence), the same with fence_scsi (no daemons:
#      its registrations are its own, key_value=hash):
#      B registered with `fence_scsi -o on`, then A; `stonith_admin --fence nodeB` through a
#      fence_scsi resource on A's paths; B's key gone from every LU; B unfenced as in 4.
# fence_scsi always sends PREEMPT AND ABORT, which deadlocks LIO over tcm_loop on Linux 6.1
# (tests/lab/README.md, "Limits"), so its sg_persist is a wrapper that sends PREEMPT instead, as
# blkfenced's resource does here (preempt = "preempt"): the same commands otherwise, one process
# per LU and command. No timing is asserted; the times are printed, and kept in
# $BLKFENCE_LAB_OUT/pacemaker-times.
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

# --- Pacemaker ------------------------------------------------------------------------------------
pcmk_stop() {
  local pid
  for pid in $(cat "$pcmk/pacemakerd.pid" "$pcmk/corosync.pid" 2>/dev/null); do
    kill -TERM "$pid" 2>/dev/null
    for ((try = 0; try < 300; try++)); do bf_alive "$pid" || break; sleep 0.1; done
    bf_alive "$pid" && kill -KILL "$pid" 2>/dev/null
  done
  cp /var/log/pacemaker/pacemaker.log "$BLKFENCE_LAB_OUT/pacemaker.log" 2>/dev/null
  cp "$pcmk/corosync.log" "$BLKFENCE_LAB_OUT/corosync.log" 2>/dev/null
  return 0
}
trap 'pcmk_stop; bf_save_logs' EXIT

# pcmk_start: corosync (one node, nodeA on 127.0.0.1) and pacemakerd, until the CIB answers.
# Fencing needs no DC: the fencer registers the devices of the CIB and runs the agents itself.
# Every client call is bounded (timeout): a client of a daemon still starting may wait for ever.
pcmk_start() {
  cat >/etc/corosync/corosync.conf <<CONF
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
  logfile: $pcmk/corosync.log
}
quorum {
  provider: corosync_votequorum
}
nodelist {
  node {
    name: nodeA
    nodeid: 1
    ring0_addr: 127.0.0.1
  }
}
CONF
  rm -rf /var/lib/pacemaker/cib/* /var/lib/pacemaker/pengine/*
  mkdir -p /var/log/pacemaker /var/lib/corosync
  chown hacluster:haclient /var/log/pacemaker
  corosync -f >>"$pcmk/corosync.out" 2>&1 &
  echo $! >"$pcmk/corosync.pid"
  local try quorum=""
  for ((try = 0; try < 120; try++)); do
    # corosync-quorumtool exits 0 even when it cannot reach corosync yet: read what it says.
    quorum=$(timeout 5 corosync-quorumtool -s 2>&1)
    [[ $quorum == *"Quorate:"*"Yes"* ]] && break
    sleep 0.5
  done
  [[ $quorum == *"Quorate:"*"Yes"* ]] || { echo "corosync is not quorate after 60 s: $quorum"; return 1; }
  PCMK_logfile=/var/log/pacemaker/pacemaker.log pacemakerd >>"$pcmk/pacemakerd.out" 2>&1 &
  echo $! >"$pcmk/pacemakerd.pid"
  for ((try = 0; try < 120; try++)); do
    timeout 5 cibadmin -Q >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "Pacemaker's CIB does not answer after 60 s:"; tail -5 /var/log/pacemaker/pacemaker.log
  return 1
}

# stonith_registered DEVICE: the fencer lists DEVICE (yes) or not (no).
stonith_registered() {
  local list
  list=$(timeout 10 stonith_admin --list-registered 2>&1) || { echo "stonith_admin --list-registered failed: $list" >&2; return 1; }
  [[ $list == *"$1"* ]] && echo yes || echo no
}
# await_registered DEVICE yes|no: until the fencer has (or no longer has) DEVICE; 60 s at most.
await_registered() {
  local try got
  for ((try = 0; try < 600; try++)); do
    got=$(stonith_registered "$1") && [[ $got == "$2" ]] && return 0
    sleep 0.1
  done
  echo "the fencer's devices: $(timeout 10 stonith_admin --list-registered 2>&1 | tr '\n' ' ')"
  return 1
}
# stonith_create ID AGENT NAME=VALUE...: a stonith resource in the CIB.
stonith_create() {
  local id=$1 agent=$2 nv xml
  shift 2
  xml="<primitive id=\"$id\" class=\"stonith\" type=\"$agent\"><instance_attributes id=\"$id-ia\">"
  for nv in "$@"; do
    xml+="<nvpair id=\"$id-${nv%%=*}\" name=\"${nv%%=*}\" value=\"${nv#*=}\"/>"
  done
  timeout 30 cibadmin -C -o resources -X "$xml</instance_attributes></primitive>"
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

# --- 2. Pacemaker with fence_blkfence -------------------------------------------------------------
# Pacemaker looks for fence agents in /usr/sbin (the guest's overlay, not the host's).
cp "$agent_src" /usr/sbin/fence_blkfence
start=$EPOCHREALTIME
lab_expect "corosync and Pacemaker start (one node, nodeA)" pcmk_start
took=$(elapsed "$start")
lab_log "Pacemaker started (its CIB answers) in $took s"
printf 'pacemaker start (CIB answers)\t%s\t0\n' "$took" >>"$times"
lab_expect "stonith-enabled and no-quorum-policy set" \
  sh -c 'timeout 30 crm_attribute -t crm_config -n stonith-enabled -v true &&
    timeout 30 crm_attribute -t crm_config -n no-quorum-policy -v ignore'
lab_expect "the fence_blkfence stonith resource is created" stonith_create blkfence fence_blkfence \
  "nodes=nodeA:1,nodeB:2" "resource=shared" "socket=$BF/A/run/control.sock" \
  "blkfencectl_path=$BLKFENCECTL" "pcmk_off_timeout=120s"
lab_expect "the fencer registers it" await_registered blkfence yes
took=$(elapsed "$start")
lab_log "the fencer registered fence_blkfence $took s after corosync started"
printf 'pacemaker start to fence_blkfence registered\t%s\t0\n' "$took" >>"$times"
lab_expect "validate-all through the fencer (stonith_admin --validate) passes" \
  timeout 60 stonith_admin --validate --agent fence_blkfence --option "nodes=nodeA:1,nodeB:2" \
  --option resource=shared --option "socket=$BF/A/run/control.sock" --option "blkfencectl_path=$BLKFENCECTL"
lab_expect_read "Pacemaker learns the targets from the agent's list" "nodeA nodeB" \
  sh -c 'timeout 60 stonith_admin --list-targets blkfence | grep -v "targets found" | sort | tr "\n" " " | sed "s/ $//"'

# --- 3. fence nodeB --------------------------------------------------------------------------------
fence_timed "fence_blkfence: stonith_admin --fence nodeB ($count LUs)" stonith_admin --fence nodeB --timeout 120
lab_expect_eq "stonith_admin --fence nodeB succeeds" "$?" 0
lab_expect_read "B's key is on none of the $count LUs, A's on every one (sg_persist)" "$key_a " bf_keys_everywhere $lus
b_dev=$(lab_dev B "$first")
lab_expect_eq "B's write is refused by the target" "$(lab_write "$b_dev" 100 "B after the fence")" "Invalid exchange"
lab_expect "B's daemon reports fenced" bf_await B shared state fenced
fence_timed "fence_blkfence: stonith_admin --fence nodeA (this node)" stonith_admin --fence nodeA --timeout 30
lab_expect "stonith_admin --fence nodeA (this node) fails" test "$?" -ne 0
lab_expect_read "A's key is still on every LU (nothing fenced A)" "$key_a " bf_keys_everywhere $lus

# --- 4. unfence nodeB ------------------------------------------------------------------------------
fence_timed "fence_blkfence: stonith_admin --unfence nodeB (one-node cluster)" stonith_admin --unfence nodeB --timeout 60
lab_expect "stonith_admin --unfence nodeB fails: on runs on the target, which is no member here" test "$?" -ne 0
lab_expect_read "B is still fenced" "$key_a " bf_keys_everywhere $lus
fence_timed "fence_blkfence: on as nodeB's fencer runs it ($count LUs)" \
  sh -c 'printf "%s\n" action=on port=nodeB nodename=nodeB "nodes=nodeA:1,nodeB:2" resource=shared \
    "socket=$1" "blkfencectl_path=$2" | /usr/sbin/fence_blkfence' sh "$BF/B/run/control.sock" "$BLKFENCECTL"
lab_expect_eq "the agent's on for nodeB, on nodeB, succeeds" "$?" 0
lab_expect_read "A's and B's keys are on every LU again" "$(printf '%s\n' "$key_a" "$key_b" | sort | tr '\n' ' ')" \
  bf_keys_everywhere $lus
lab_expect "B writes again" lab_write "$b_dev" 100 "B after the unfence"

lab_expect "the fence_blkfence resource is deleted" timeout 30 cibadmin -D -o resources -X '<primitive id="blkfence"/>'
lab_expect "the fencer drops it" await_registered blkfence no
bf_stop A
bf_stop B

# --- 5. device mode: no blkfenced ------------------------------------------------------------------
# The daemons stop (their keys stay registered); the agent finds nobody on its socket and sends the
# PR commands itself with blkfencectl device, on A's paths, with the keys blkfenced would use.
lab_expect "the fence_blkfence resource in device mode is created" stonith_create blkfence-dev fence_blkfence \
  "nodes=nodeA:1,nodeB:2" "cluster=lab" "devices=$(devs_of A sd ,)" "preempt=preempt" \
  "socket=$BF/none.sock" "blkfencectl_path=$BLKFENCECTL" "pcmk_off_timeout=120s"
lab_expect "the fencer registers it" await_registered blkfence-dev yes
fence_timed "fence_blkfence (device mode): stonith_admin --fence nodeB ($count LUs)" \
  stonith_admin --fence nodeB --timeout 120
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
lab_expect "the device-mode resource is deleted" timeout 30 cibadmin -D -o resources -X '<primitive id="blkfence-dev"/>'
lab_expect "the fencer drops it" await_registered blkfence-dev no

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
rm -f /var/run/cluster.key /var/run/cluster.dev  # fence_scsi's key and device files
a_devs=$(devs_of A sd ,) b_devs=$(devs_of B sd ,)
scsi_on() {  # scsi_on NODE DEVICES: fence_scsi's on, as NODE's fencer runs it
  printf '%s\n' action=on "port=$1" "nodename=$1" "devices=$2" key_value=hash \
    "sg_persist_path=$pcmk/sg_persist" | fence_scsi
}
lab_expect "fence_scsi: B registers (on)" scsi_on nodeB "$b_devs"
lab_expect "fence_scsi: A registers (on; its key file is A's)" scsi_on nodeA "$a_devs"
scsi_a=0x$(cat /var/run/cluster.key)
lab_expect "fence_scsi: A's key is a key ('$scsi_a')" lab_is_key "$scsi_a"
lab_expect "the fence_scsi stonith resource is created" stonith_create scsi fence_scsi \
  "devices=$a_devs" key_value=hash "sg_persist_path=$pcmk/sg_persist" "pcmk_host_list=nodeA nodeB" \
  "pcmk_off_timeout=300s"
lab_expect "the fencer registers it" await_registered scsi yes
fence_timed "fence_scsi: stonith_admin --fence nodeB ($count LUs)" stonith_admin --fence nodeB --timeout 300
lab_expect_eq "stonith_admin --fence nodeB through fence_scsi succeeds" "$?" 0
lab_expect_read "fence_scsi: only A's key is left on the $count LUs" "$scsi_a " bf_keys_everywhere $lus
fence_timed "fence_scsi: on as nodeB's fencer runs it ($count LUs)" scsi_on nodeB "$b_devs"
lab_expect_read "fence_scsi: A and B are registered again on every LU" "2 " registrations_everywhere

lab_log "times (seconds, exit status):"
column -t -s $'\t' "$times"
lab_done

# Builds a LIO topology inside the lab guest: LAB_LUNS file-backed LUs shared by LAB_NODES nodes over
# LAB_FABRIC (tcm_loop or iscsi), then maps node -> LU -> /dev/sdX and /dev/sgN.
#
# Written against configfs directly rather than targetcli: targetcli-fb needs a system D-Bus in the
# guest, and each of its invocations costs seconds of Python start-up under TCG (a 32-LU topology
# would take minutes); configfs is what targetcli writes in the end, and here every step is visible.
#
# Identities are fixed so that tests can name things:
#   LU i (0-based):  unit serial b1f0ce<i:4 hex>0000..., so LIO's NAA WWN is naa.6001405b1f0ce<i>...
#   node n (1-based, named A, B, ...):
#     tcm_loop  target naa.5001405b1f0ce<n:3 hex>, initiator port naa.5001405b1f0c1<n:3 hex>
#     iscsi     initiator iqn.2026-11.org.blkfence.lab:node-<a,b,...>, open-iscsi iface lab-<a,b,...>,
#               one target iqn.2026-11.org.blkfence.lab:target on 127.0.0.1:3260 with one ACL per node
# Each node therefore reaches every LU through its own I_T nexus.
#
# Sourced by guest/stage2 and lib/guest.sh; its pipelines fail when any command in them does, so a
# node without a SCSI host fails the map instead of leaving a line out.
set -o pipefail

lab_cfs=/sys/kernel/config/target
lab_iscsi_target=iqn.2026-11.org.blkfence.lab:target
lab_lu_dir=/lab/lu

lab_node_name() { printf "\\x$(printf %x $((64 + $1)))"; }  # 1 -> A, 2 -> B, ...
lab_node_lower() { lab_node_name "$1" | tr A-Z a-z; }
lab_lu_serial() { printf 'b1f0ce%04x0000000000000000000000' "$1"; }
lab_loop_target() { printf 'naa.5001405b1f0ce%03x' "$1"; }
lab_loop_initiator() { printf 'naa.5001405b1f0c1%03x' "$1"; }
lab_iscsi_initiator() { printf 'iqn.2026-11.org.blkfence.lab:node-%s' "$(lab_node_lower "$1")"; }

lab_load_modules() {
  local -a fabric=(tcm_loop)
  [[ $LAB_FABRIC == iscsi ]] && fabric=(iscsi_target_mod iscsi_tcp)
  modprobe -a target_core_mod target_core_file sd_mod sg "${fabric[@]}"
}

# LIO answers REGISTER with NOT READY when it cannot write its PR metadata file, although the
# registration took effect (docs/design.md §7): the directory must exist before the first PR OUT.
# With a disk (LAB_DISK=1, tests/lab/run --reboots) the LU files live on it and a boot after a
# reboot finds them, and LIO's PR metadata, where the last boot left them: the backstores are
# created again from the same files with the same serials (so the same WWNs), and their APTPL
# state is restored before any LU is exported (lab_restore_aptpl).
lab_create_backstores() {
  mkdir -p /var/target/pr "$lab_lu_dir" || return 1
  if [[ ${LAB_DISK:-0} != 1 ]]; then
    mount -t tmpfs -o size=90% tmpfs "$lab_lu_dir" || return 1
  fi
  local i dev
  local -a files=()
  for ((i = 0; i < LAB_LUNS; i++)); do files+=("$lab_lu_dir/lu$i.img"); done
  truncate -s "${LAB_LUN_SIZE_MB}M" "${files[@]}" || return 1  # sparse: memory only when written
  for ((i = 0; i < LAB_LUNS; i++)); do
    dev=$lab_cfs/core/fileio_0/lu$i
    mkdir -p "$dev" &&
      echo "fd_dev_name=$lab_lu_dir/lu$i.img,fd_dev_size=$((LAB_LUN_SIZE_MB << 20))" >"$dev/control" &&
      echo 1 >"$dev/enable" &&
      echo "$(lab_lu_serial "$i")" >"$dev/wwn/vpd_unit_serial" &&
      lab_restore_aptpl "$dev" "$(lab_lu_serial "$i")" || {
      echo "creating backstore lu$i failed"
      return 1
    }
  done
}

# lab_restore_aptpl DEV_DIR SERIAL: the registrations (and the reservation) that LIO saved for a
# LU whose last REGISTER set APTPL, given back to it after a reboot. LIO writes them to
# /var/target/pr/aptpl_SERIAL but never reads that file: the restore of a saved target
# configuration (targetcli's) does, one registration at a time, its key=value lines joined by
# commas, into pr/res_aptpl_metadata, before the LU is exported (LIO refuses it afterwards). No
# file: nothing to restore.
lab_restore_aptpl() {
  local file=/var/target/pr/aptpl_$2 line registration=""
  [[ -f $file ]] || return 0
  while IFS= read -r line; do
    case $line in
      PR_REG_START:*) registration="" ;;
      PR_REG_END:*)
        echo "${registration#,}" >"$1/pr/res_aptpl_metadata" || { echo "restoring $file failed"; return 1; }
        echo "restored a registration of $2 from $file" ;;
      ?*=*) registration+=",$line" ;;
    esac
  done <"$file"
}

# One loopback target per node: its own SCSI host, its own I_T nexus to every LU.
lab_create_tcm_loop() {
  local n i tpg
  for ((n = 1; n <= LAB_NODES; n++)); do
    tpg=$lab_cfs/loopback/$(lab_loop_target "$n")/tpgt_1
    # The nexus must exist before the LUs are linked: linking a LU adds its SCSI device at once,
    # and tcm_loop fails commands on a TPG without a nexus ("I_T Nexus does not exist").
    mkdir -p "$tpg" && echo "$(lab_loop_initiator "$n")" >"$tpg/nexus" || return 1
    for ((i = 0; i < LAB_LUNS; i++)); do
      mkdir "$tpg/lun/lun_$i" && ln -s "$lab_cfs/core/fileio_0/lu$i" "$tpg/lun/lun_$i/lu$i" || return 1
    done
  done
}

# One iSCSI target on 127.0.0.1 with an ACL per node; each node logs in through its own iface.
lab_create_iscsi() {
  local tpg=$lab_cfs/iscsi/$lab_iscsi_target/tpgt_1 n i acl
  mkdir -p "$tpg/np/127.0.0.1:3260" || return 1
  for ((i = 0; i < LAB_LUNS; i++)); do
    mkdir "$tpg/lun/lun_$i" && ln -s "$lab_cfs/core/fileio_0/lu$i" "$tpg/lun/lun_$i/lu$i" || return 1
  done
  for ((n = 1; n <= LAB_NODES; n++)); do
    acl=$tpg/acls/$(lab_iscsi_initiator "$n")
    mkdir -p "$acl" || return 1
    for ((i = 0; i < LAB_LUNS; i++)); do
      mkdir "$acl/lun_$i" && ln -s "$tpg/lun/lun_$i" "$acl/lun_$i/lun_$i" || return 1
    done
  done
  echo 0 >"$tpg/attrib/authentication" && echo 1 >"$tpg/enable" || return 1

  mkdir -p /etc/iscsi /run/lock/iscsi
  echo "InitiatorName=iqn.2026-11.org.blkfence.lab:default" >/etc/iscsi/initiatorname.iscsi
  rm -rf /etc/iscsi/nodes /etc/iscsi/send_targets /etc/iscsi/ifaces /var/lib/iscsi
  iscsid || return 1
  local -a ifaces=()
  for ((n = 1; n <= LAB_NODES; n++)); do
    local iface=lab-$(lab_node_lower "$n")
    iscsiadm -m iface -I "$iface" -o new >/dev/null &&
      iscsiadm -m iface -I "$iface" -o update -n iface.initiatorname -v "$(lab_iscsi_initiator "$n")" >/dev/null ||
      return 1
    ifaces+=(-I "$iface")
  done
  iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3260 "${ifaces[@]}" &&
    iscsiadm -m node -T "$lab_iscsi_target" -p 127.0.0.1:3260 --login
}

# "node host" lines: the SCSI host number through which each node reaches the LUs.
lab_node_hosts() {
  local n
  for ((n = 1; n <= LAB_NODES; n++)); do
    local host=""
    if [[ $LAB_FABRIC == tcm_loop ]]; then
      host=$(cut -d: -f1 "$lab_cfs/loopback/$(lab_loop_target "$n")/tpgt_1/address")
    else
      local s
      for s in /sys/class/iscsi_session/session*; do
        [[ $(cat "$s/initiatorname") == "$(lab_iscsi_initiator "$n")" ]] || continue
        host=$(readlink -f "$s/device" | grep -o 'host[0-9]*' | tail -n 1)
        host=${host#host}
      done
    fi
    [[ -n $host ]] || return 1
    echo "$(lab_node_name "$n") $host"
  done
}

# Waits (bounded) until every node sees every LU with both its sd and sg node; scanning is
# asynchronous after a nexus is created or a session logs in.
lab_await_devices() {
  local want=$((LAB_NODES * LAB_LUNS)) have=0 try hosts
  hosts=$(lab_node_hosts | cut -d' ' -f2) || { echo "a node has no SCSI host"; return 1; }
  for ((try = 0; try < 300; try++)); do
    have=0
    local host d
    for host in $hosts; do
      for d in /sys/class/scsi_device/"$host":*/device; do
        [[ -e $d/block && -e $d/scsi_generic ]] && have=$((have + 1))
      done
    done
    ((have == want)) && return 0
    sleep 0.2
  done
  echo "only $have of $want node/LU devices appeared within 60 s"
  return 1
}

# The map for tests: one line per node and LU (guest/map.py).
lab_write_map() {
  lab_node_hosts | python3 "$LAB_REPO/tests/lab/guest/map.py" "$LAB_FABRIC" "$1" "$2"
}

# Under TCG every process start costs about 0.2 s (dynamic linking over 9p); building a 32-LU
# topology spawns hundreds of mkdir and ln. Bash's loadable builtins (package bash-builtins) do the
# same in-process; without the package the external commands are used.
lab_enable_builtins() {
  local b
  for b in mkdir ln rm sleep; do
    [[ -f /usr/lib/bash/$b ]] && enable -f "/usr/lib/bash/$b" "$b" 2>/dev/null
  done
  return 0
}

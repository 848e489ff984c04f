#!/bin/bash
# Path faults under blkfenced on iSCSI (issue 12's lab fault matrix): node A reaches a LU of its own
# through two sessions (two I_T nexuses: portals 127.0.0.2 and 127.0.0.3 of a second portal group
# of the target, which holds only this LU and maps it to node A only), names it by WWN so that its
# daemon finds both paths, and holds it (check_interval 1 s, command_timeout 2 s, lease 5 s: the
# defaults, which docs/protocol.md says ride out one hung path). Then:
#   1. a hung path: nftables drops every packet of one session (so the host does not see it fail:
#      its commands hang until the session recovers) for several leases, first the path the reads
#      start on, then, once it is back, the other one: the gate stays open throughout (`gate check`
#      every second), no lost contact, the monitor goes on finishing rounds, and after the first
#      path came back the reads use it again (they must while the second one hangs);
#   2. a device re-added under the same H:C:T:L (delete, then a rescan of that host): the daemon
#      drops the old path, closes its fd, takes the new device, registers its key on it, and its
#      gate stays open; it holds one fd per path, none on a removed device;
#   3. a path-flap soak: the same delete/rescan of one path, as many cycles as fit in SOAK_S
#      seconds, at most SOAK_CYCLES: the gate never closes, no lost contact, and at the end the
#      daemon holds as many device fds as at the start, none on a removed device, and its RSS grew
#      by less than 2 MiB. (Each cycle leaves udevd about 0.15 s of events to work through under
#      TCG after the soak: 556 cycles in 45 s took 85 s to settle.)
# systemd-udevd runs for the check's duration (the daemon hears about devices through udev).
# Leaves no session, portal group, LU, nftables table or udevd behind.
#   usage: paths.sh [SOAK_S] [BLOCK_S] [SOAK_CYCLES]    (defaults 45, 10 and 200)
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
soak_s=${1:-45} block_s=${2:-10} soak_cycles=${3:-200}
[[ $LAB_FABRIC == iscsi ]] || { lab_not_ok "paths.sh needs the iscsi fabric"; lab_done; exit; }
tpg=$lab_cfs/iscsi/$lab_iscsi_target/tpgt_2
backstore=$lab_cfs/core/fileio_0/lu_paths
acl=$tpg/acls/$(lab_iscsi_initiator 1)
portals=(127.0.0.2 127.0.0.3)
res=paths
rss_growth_max_kb=2048

cleanup() {
  bf_stop A
  nft delete table inet bf_paths >/dev/null 2>&1
  local ip
  for ip in "${portals[@]}"; do
    iscsiadm -m node -T "$lab_iscsi_target" -p "$ip:3260" -I lab-a --logout >/dev/null 2>&1
    iscsiadm -m node -T "$lab_iscsi_target" -p "$ip:3260" -I lab-a -o delete >/dev/null 2>&1
  done
  rm -f "$acl/lun_0/lun_0" "$tpg/lun/lun_0/lu_paths"
  rmdir "$acl/lun_0" "$acl" "$tpg/lun/lun_0" 2>/dev/null
  for ip in "${portals[@]}"; do rmdir "$tpg/np/$ip:3260" 2>/dev/null; done
  [[ -d $tpg ]] && { echo 0 >"$tpg/enable"; rmdir "$tpg"; } 2>/dev/null
  rmdir "$backstore" 2>/dev/null
  rm -f "$lab_lu_dir/lu_paths.img"
  udevadm control --exit >/dev/null 2>&1
}
trap 'cleanup; bf_save_logs' EXIT

# The second portal group: one LU, node A's ACL only, two portals.
make_portal_group() {
  local ip
  truncate -s 64M "$lab_lu_dir/lu_paths.img" &&
    mkdir -p "$backstore" &&
    echo "fd_dev_name=$lab_lu_dir/lu_paths.img,fd_dev_size=$((64 << 20))" >"$backstore/control" &&
    echo 1 >"$backstore/enable" &&
    echo "b1f0cepa7b500000000000000000000" >"$backstore/wwn/vpd_unit_serial" || return 1
  mkdir -p "$tpg" || return 1
  for ip in "${portals[@]}"; do mkdir -p "$tpg/np/$ip:3260" || return 1; done
  mkdir "$tpg/lun/lun_0" && ln -s "$backstore" "$tpg/lun/lun_0/lu_paths" &&
    mkdir -p "$acl/lun_0" && ln -s "$tpg/lun/lun_0" "$acl/lun_0/lun_0" &&
    echo 0 >"$tpg/attrib/authentication" && echo 1 >"$tpg/enable"
}

# login IP: node A's session through that portal.
login() {
  iscsiadm -m node -o new -T "$lab_iscsi_target" -p "$1:3260,2" -I lab-a >/dev/null &&
    iscsiadm -m node -T "$lab_iscsi_target" -p "$1:3260" -I lab-a --login >/dev/null
}

# session_of IP: "SID HOST" of node A's session through that portal.
session_of() {
  local s sid
  for s in /sys/class/iscsi_session/session*; do
    sid=${s##*session}
    [[ $(cat "$s/initiatorname") == "$(lab_iscsi_initiator 1)" && $(cat "$s/tpgt") == 2 &&
      $(cat "/sys/class/iscsi_connection/connection$sid:0/persistent_address") == "$1" ]] || continue
    local host
    host=$(readlink -f "$s/device" | grep -o 'host[0-9]*' | tail -n 1) || return 1
    echo "$sid ${host#host}"
    return 0
  done
  return 1
}

# device_of HOST: the H:C:T:L of the LU's SCSI device on that host, once its sg node exists.
device_of() {
  local d
  for d in /sys/class/scsi_device/"$1":*; do
    [[ -e $d/device/scsi_generic ]] && { echo "${d##*/}"; return 0; }
  done
  return 1
}
sg_of() { local sg=(/sys/class/scsi_device/"$1"/device/scsi_generic/*) && [[ -e ${sg[0]} ]] && echo "/dev/${sg[0]##*/}"; }

# await TRIES COMMAND...: polls every 0.1 s until COMMAND succeeds.
await() {
  local tries=$1 try
  shift
  for ((try = 0; try < tries; try++)); do "$@" && return 0; sleep 0.1; done
  return 1
}

# fds_settled WANT: "FDS DELETED [NAMES]" of A's daemon once it reads WANT, or after 10 s what it
# reads then. A replaced device's fd is opened by the next command on that path (a monitor round),
# not when the daemon learns of the path: read at once, the count can be one short.
fds_settled() {
  local try held deleted names got=""
  for ((try = 0; try < 100; try++)); do
    read -r held deleted _ names < <(fds "$pid")
    got="$held $deleted${names:+ $names}"
    [[ $got == "$1" ]] && break
    sleep 0.1
  done
  printf '%s\n' "$got"
}

# The daemon's view: the devices its status lists for the LU, sorted.
listed_devices() {
  bf_ctl A status "$res" --json |
    python3 -c 'import json, sys; print(" ".join(sorted(json.load(sys.stdin)["resources"][0]["lus"][0]["devices"])))'
}
lists_exactly() { local got; got=$(listed_devices) && [[ $got == "$1" ]]; }
current_sgs() { local a b; a=$(sg_of "${hctl[0]}") && b=$(sg_of "${hctl[1]}") && printf '%s\n' "$a" "$b" | sort | tr '\n' ' ' | sed 's/ $//'; }
daemon_lists_current() { local want; want=$(current_sgs) && lists_exactly "$want"; }

# fds PID: "DEVICE_FDS DELETED RSS_KB [DELETED NODE...]": the daemon's fds on /dev/sg* and /dev/sd*,
# how many of them are on a removed device (the node unlinked: "(deleted)"), and its VmRSS.
fds() {
  python3 - "$1" <<'PY'
import os, sys
pid = sys.argv[1]
held, deleted = 0, []
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except FileNotFoundError:
        continue
    if target.startswith(("/dev/sg", "/dev/sd")):
        held += 1
        if target.endswith(" (deleted)"):
            deleted.append(target.replace(" ", "_"))
rss = next(line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
print(held, len(deleted), rss, *deleted)
PY
}

# block IP / unblock: drop every packet to and from the portal (the session hangs: nothing tells
# the host, which finds out only when its NOP-Outs time out, and cannot log in again meanwhile).
block() {
  nft -f - <<NFT
table inet bf_paths {
  chain input {
    type filter hook input priority 0; policy accept;
    ip daddr $1 tcp dport 3260 drop
    ip saddr $1 tcp sport 3260 drop
  }
}
NFT
}
unblock() { nft delete table inet bf_paths; }
session_back() { [[ $(cat "/sys/class/iscsi_session/session$1/state") == LOGGED_IN && $(cat "/sys/class/scsi_device/$2/device/state") == running ]]; }

state_and_gate() { local state gate; state=$(bf_field A "$res" state) && gate=$(bf_field A "$res" gate_open) && echo "$state $gate"; }

# io_counts: each path's commands issued, done and failed so far (the SCSI device's counters).
io_counts() {
  local i d out=""
  for i in 0 1; do
    d=/sys/class/scsi_device/${hctl[$i]}/device
    out+="path $i: $(($(<"$d/iorequest_cnt"))) issued, $(($(<"$d/iodone_cnt"))) done, $(($(<"$d/ioerr_cnt"))) failed; "
  done
  echo "${out%; }"
}

# hang INDEX: path INDEX hangs for block_s seconds while A holds; then it comes back.
hang() {
  local i=$1 ip=${path_ip[$1]} closed=0 checks_before checks_after t_end
  checks_before=$(bf_checks A "$res") || { lab_not_ok "cannot read A's rounds"; return; }
  lab_expect "path $i ($ip, ${hctl[$i]}) is blocked" block "$ip"
  lab_log "path $i ($ip) blocked for ${block_s}s ($(io_counts))"
  t_end=$((SECONDS + block_s))
  while ((SECONDS < t_end)); do
    bf_ctl A gate check "$res" >/dev/null 2>&1 || closed=$((closed + 1))
    sleep 1
  done
  lab_expect_eq "with path $i hung for ${block_s}s, gate check said open every second" "$closed" 0
  lab_expect_read "... no lost contact" 0 bf_metric A "blkfence_lost_contact_total{resource=\"$res\"}"
  checks_after=$(bf_checks A "$res")
  lab_log "A finished $((checks_after - checks_before)) monitor rounds while path $i hung ($(io_counts); $(bf_metric A "blkfence_check_failures_total{resource=\"$res\"}") failed rounds so far)"
  lab_expect "... and the monitor finished at least $((block_s / 3)) rounds meanwhile" \
    test "$((checks_after - checks_before))" -ge $((block_s / 3))
  lab_expect_read "... A still holds with its gate open" "held true" state_and_gate
  lab_expect "path $i is unblocked" unblock
  lab_expect "path $i's session logs in again" await 900 session_back "${sid[$i]}" "${hctl[$i]}"
}

nft list tables >/dev/null 2>&1 || { lab_not_ok "nft does not work in the guest (package nftables, tests/install-deps)"; lab_done; exit; }
/lib/systemd/systemd-udevd --daemon </dev/null >/dev/null 2>&1
lab_expect "systemd-udevd runs" udevadm control --ping --timeout=10
lab_expect "a second portal group with a LU of node A's own" make_portal_group
declare -a sid host hctl path_ip
for ip in "${portals[@]}"; do
  lab_expect "A logs in through $ip" login "$ip"
done
for i in 0 1; do
  read -r "sid[i]" "host[i]" < <(session_of "${portals[i]}") || { lab_not_ok "no session of A through ${portals[i]}"; lab_done; exit; }
  await 300 device_of "${host[i]}" >/dev/null || { lab_not_ok "the LU did not appear on host ${host[i]}"; lab_done; exit; }
  hctl[i]=$(device_of "${host[i]}") path_ip[i]=${portals[i]}
done
# The reads start on the first path in discovery order (the H:C:T:L sorted as text): it hangs first.
if [[ ${hctl[1]} < ${hctl[0]} ]]; then
  sid=("${sid[1]}" "${sid[0]}") host=("${host[1]}" "${host[0]}") hctl=("${hctl[1]}" "${hctl[0]}")
  path_ip=("${path_ip[1]}" "${path_ip[0]}")
fi
wwn=$(tr -d '\0\n ' <"/sys/class/scsi_device/${hctl[0]}/device/wwid")
lab_log "A's paths to $wwn: ${hctl[0]} $(sg_of "${hctl[0]}") (${path_ip[0]}), ${hctl[1]} $(sg_of "${hctl[1]}") (${path_ip[1]})"

rm -rf "$BF/A"
mkdir -p "$BF/A/state" "$BF/A/run"
cat >"$BF/A/blkfence.toml" <<TOML
cluster = "lab"
node_id = 1
state_dir = "$BF/A/state"
run_dir = "$BF/A/run"

[[resource]]
name = "$res"
devices = ["$wwn"]
preempt = "preempt"
check_interval = "1s"
lease = "5s"
command_timeout = "2s"
on_fenced = "none"
TOML
lab_expect "A's daemon starts" bf_start A
lab_expect "A acquires $res" bf_ctl A acquire "$res" --timeout 30s
key=$(bf_field A "$res" key)
lab_expect "A's status names its key ('$key')" lab_is_key "$key"
lab_expect_read "A's key is registered on both nexuses" "$key $key " lab_keyset "$(sg_of "${hctl[1]}")"
lab_expect "A's daemon lists both paths" daemon_lists_current
pid=$(cat "$BF/A/pid")
read -r fds_start _ rss_start _ < <(fds "$pid")
lab_log "A's daemon: $fds_start device fds, VmRSS $rss_start kB"
lab_expect_eq "A's daemon holds one fd per path" "$fds_start" 2

# --- 1. a hung path, then the other ----------------------------------------------------------------
hang 0
hang 1

# --- 2. a device re-added under the same H:C:T:L ---------------------------------------------------
old_sg=$(sg_of "${hctl[0]}")
IFS=: read -r h c t l <<<"${hctl[0]}"
echo 1 >"/sys/class/scsi_device/${hctl[0]}/device/delete"
echo "$c $t $l" >"/sys/class/scsi_host/host$h/scan"
lab_expect "${hctl[0]} is back after delete and rescan" await 100 sg_of "${hctl[0]}"
new_sg=$(sg_of "${hctl[0]}")
lab_log "${hctl[0]}: $old_sg before, $new_sg after"
udevadm settle --timeout=60
lab_expect "A's daemon lists the re-added device, not the removed one" await 300 daemon_lists_current
if [[ $new_sg != "$old_sg" ]]; then
  lab_expect "A's daemon registers its key on it again (its log)" bf_await_log A "registered $key on $new_sg" 300
else
  # The daemon's fd was closed (ENODEV) before the rescan, so the kernel gave the name back: the
  # daemon may see the same path and register nothing; the I_T nexus keeps the key either way.
  lab_log "${hctl[0]} came back under its old name $old_sg"
fi
lab_expect_read "A's key is still registered on both nexuses" "$key $key " lab_keyset "$new_sg"
lab_expect_read "A's gate stayed open" true bf_field A "$res" gate_open
lab_expect_eq "A's daemon holds one fd per path, none on the removed device" "$(fds_settled "2 0")" "2 0"

# --- 3. path-flap soak -----------------------------------------------------------------------------
IFS=: read -r h c t l <<<"${hctl[1]}"
cycles=0 soak_end=$((SECONDS + soak_s)) lost_before=$(bf_metric A "blkfence_lost_contact_total{resource=\"$res\"}")
flap_failed=""
while ((SECONDS < soak_end && cycles < soak_cycles)); do
  echo 1 >"/sys/class/scsi_device/${hctl[1]}/device/delete" || { flap_failed="delete failed"; break; }
  echo "$c $t $l" >"/sys/class/scsi_host/host$h/scan" || { flap_failed="scan failed"; break; }
  for ((try = 0; try < 100; try++)); do
    [[ -e /sys/class/scsi_device/${hctl[1]}/device/scsi_generic ]] && break
    sleep 0.05
  done
  [[ -e /sys/class/scsi_device/${hctl[1]}/device/scsi_generic ]] || { flap_failed="${hctl[1]} did not come back"; break; }
  cycles=$((cycles + 1))
done
lab_log "path-flap soak: $cycles delete/rescan cycles of ${hctl[1]} in $((SECONDS - soak_end + soak_s))s (at most ${soak_s}s, $soak_cycles cycles)"
lab_expect_eq "the soak's cycles all went through" "${flap_failed:-yes}" yes
lab_expect "at least 50 cycles" test "$cycles" -ge 50
udevadm settle --timeout=120
lab_expect "A's daemon lists the paths as they are now" await 600 daemon_lists_current
lab_expect_read "no lost contact during the soak" "$lost_before" bf_metric A "blkfence_lost_contact_total{resource=\"$res\"}"
lab_expect_read "A's gate stayed open" true bf_field A "$res" gate_open
lab_expect "no gate closed in A's log" test "$(grep -c 'gate closed\|: lost-contact' "$BF/A/log")" -eq 0
# At most as many as at the start: the flapped path's fd is opened by the next command sent
# through it, and when the soak's last delete and rescan reached the daemon as one change (the
# path back under its old name) nothing is sent through it until a read needs it (seen once,
# after 556 cycles).
fds_after=$(fds_settled "$fds_start 0")
read -r _ _ rss_end _ < <(fds "$pid")
lab_log "A's daemon after the soak: device fds and those on removed devices '$fds_after', VmRSS $rss_end kB (at start $rss_start kB)"
read -r held_after deleted_after _ <<<"$fds_after"
lab_expect "no more device fds than at the start ($fds_start), at least one" \
  test "$held_after" -le "$fds_start" -a "$held_after" -ge 1
lab_expect_eq "no device fd on a removed device" "$deleted_after" 0
lab_expect "VmRSS grew by less than $rss_growth_max_kb kB" test $((rss_end - rss_start)) -lt "$rss_growth_max_kb"
lab_expect_read "A's key is registered on both nexuses at the end" "$key $key " lab_keyset "$(sg_of "${hctl[0]}")"
lab_done

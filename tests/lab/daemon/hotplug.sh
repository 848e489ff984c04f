#!/bin/bash
# Path hot-plug in blkfenced (issue 4, deliverable 3) on tcm_loop, with systemd-udevd running in the
# guest so that the daemon hears about devices exactly as on a real node (udev's monitor):
#   node A names its LU by a device-mapper multipath map over its own path; A acquires; a second
#   I_T nexus of A to the LU appears (a new tcm_loop nexus) and is added to the map: A's daemon
#   registers it with the current key (A's key is then registered twice, and a write through the
#   new path lands); B acquires (preempts A); a third nexus of A appears and joins the map while
#   A is fenced: A's daemon sees it (its status lists the path) but does not register it (S5),
#   and a write through it is refused by the target.
# Also: blkfenced --check-config resolves the devices (exit 0), and exits 78 for one that does not
# exist, and for one LU in two resources under two names (the map and the WWN), as does the start.
# Leaves no map, nexus, registration or udevd behind.
#   usage: hotplug.sh [LU]     (default: the last LU)
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
lu=${1:-$((LAB_LUNS - 1))}
[[ $LAB_FABRIC == tcm_loop ]] || { lab_not_ok "hotplug.sh needs the tcm_loop fabric"; lab_done; exit; }
map=bf-hotplug
extra_targets=()

cleanup() {
  bf_stop A
  bf_stop B
  dmsetup remove --noudevsync "$map" >/dev/null 2>&1
  local target tpg
  for target in "${extra_targets[@]}"; do
    tpg=$lab_cfs/loopback/$target/tpgt_1
    rm -f "$tpg"/lun/lun_0/lu* && rmdir "$tpg/lun/lun_0" "$tpg" "$lab_cfs/loopback/$target"
  done
  udevadm control --exit >/dev/null 2>&1
  bf_clear "$lu"
}
trap 'cleanup; bf_save_logs' EXIT

# add_nexus N: a new tcm_loop nexus of node A to the LU (its own SCSI host and initiator port);
# sets nexus_sd and nexus_sg once the kernel has added its nodes.
add_nexus() {
  local target tpg host hctl try sd sg
  nexus_sd="" nexus_sg=""
  target=$(printf 'naa.5001405b1f0cea%02x' "$1")
  tpg=$lab_cfs/loopback/$target/tpgt_1
  mkdir -p "$tpg" && printf 'naa.5001405b1f0c1a%02x\n' "$1" >"$tpg/nexus" || return 1
  extra_targets+=("$target")
  mkdir "$tpg/lun/lun_0" && ln -s "$lab_cfs/core/fileio_0/lu$lu" "$tpg/lun/lun_0/lu$lu" || return 1
  host=$(cut -d: -f1 "$tpg/address")
  hctl=$host:0:1:0
  for ((try = 0; try < 100; try++)); do
    sd=$(ls "/sys/class/scsi_device/$hctl/device/block" 2>/dev/null)
    sg=$(ls "/sys/class/scsi_device/$hctl/device/scsi_generic" 2>/dev/null)
    if [[ -n $sd && -n $sg && -b /dev/$sd && -c /dev/$sg ]]; then
      nexus_sd=/dev/$sd nexus_sg=/dev/$sg
      return 0
    fi
    sleep 0.1
  done
  return 1
}

# map_over SD...: (re)loads the multipath map over these paths, one priority group, round robin.
map_over() {
  local table paths="" dev size
  size=$(cat "/sys/class/block/${1#/dev/}/size")
  for dev in "$@"; do paths+=" $(cat "/sys/class/block/${dev#/dev/}/dev") 1"; done
  table="0 $size multipath 0 0 1 1 round-robin 0 $# 1$paths"
  if dmsetup info "$map" >/dev/null 2>&1; then
    dmsetup reload --noudevsync "$map" --table "$table" && dmsetup resume --noudevsync "$map"
  else
    dmsetup create --noudevsync "$map" --table "$table"
  fi
}

# db_devices NODE: the devices A's status lists for the LU.
db_devices() {
  bf_ctl "$1" status db --json |
    python3 -c 'import json, sys; print(" ".join(json.load(sys.stdin)["resources"][0]["lus"][0]["devices"]))'
}

# await TRIES COMMAND...: polls every 0.1 s until COMMAND succeeds.
await() {
  local tries=$1 try
  shift
  for ((try = 0; try < tries; try++)); do "$@" && return 0; sleep 0.1; done
  return 1
}
# registrations: the LU's registered keys, one per I_T nexus, sorted (read through B); fails when
# the LU cannot be read.
registrations() { lab_keyset "$(lab_dev B "$lu")"; }
keys_are() { local keys; keys=$(registrations) && [[ $keys == "$1" ]]; }
lists_device() { [[ " $(db_devices A) " == *" $1 "* ]]; }

modprobe dm_multipath && modprobe dm_round_robin || { lab_not_ok "dm_multipath is not available"; lab_done; exit; }
/lib/systemd/systemd-udevd --daemon </dev/null >/dev/null 2>&1
lab_expect "systemd-udevd runs" udevadm control --ping --timeout=10

a_sd=$(lab_dev A "$lu")
lab_expect "A's multipath map over its one path" map_over "$a_sd"
bf_config A 1 preempt "$lu" ""
bf_config B 2 preempt "$lu" ""
sed -i "s|^devices = .*|devices = [\"/dev/mapper/$map\"]|" "$BF/A/blkfence.toml"
# --check-config resolves the devices: the map's one path, under the LU's WWN; a missing one is 78.
checked=$("$BLKFENCED" --config "$BF/A/blkfence.toml" --check-config 2>&1)
lab_expect_eq "--check-config resolves A's map to the LU and its path (exit 0)" \
  "$?:$(grep -c "^# db: /dev/mapper/$map = $(lab_dev A "$lu" wwn): $(lab_dev A "$lu" sg) (" <<<"$checked")" 0:1
sed "s|^devices = .*|devices = [\"/dev/sdzz\"]|" "$BF/A/blkfence.toml" >"$BF/A/missing.toml"
"$BLKFENCED" --config "$BF/A/missing.toml" --check-config >/dev/null 2>&1
lab_expect_eq "--check-config with a device that does not exist exits 78" "$?" 78
# One LU in two resources under two names (the map, and the LU's WWN): the configuration cannot
# tell, the daemon compares WWNs once it resolved them. --check-config and the start refuse it.
wwn=$(lab_dev A "$lu" wwn)
{
  cat "$BF/A/blkfence.toml"
  printf '\n[[resource]]\nname = "db2"\ndevices = ["%s"]\non_fenced = "none"\n' "$wwn"
} >"$BF/A/twice.toml"
shared_lu="resource db2: its device \"$wwn\" is LU $wwn, which resource db has already (as \"/dev/mapper/$map\"): a LU belongs to one resource"
checked=$("$BLKFENCED" --config "$BF/A/twice.toml" --check-config 2>&1)
lab_expect_eq "--check-config with one LU in two resources exits 78" "$?" 78
lab_expect "... naming both names of the LU" grep -qxF "blkfenced: $shared_lu; name it in one resource only" <<<"$checked"
started=$(timeout 30 "$BLKFENCED" --config "$BF/A/twice.toml" --log stderr 2>&1)
lab_expect_eq "blkfenced refuses to start on it (exit 78)" "$?" 78
lab_expect "... saying why ($(tail -n 1 <<<"$started"))" grep -qF "$shared_lu; name it in one resource only" <<<"$started"
lab_expect "A's daemon starts" bf_start A
lab_expect "B's daemon starts" bf_start B
lab_expect "A acquires db" bf_ctl A acquire db --timeout 30s
key_a=$(bf_field A db key) key_b=""
lab_expect "A's status names its key ('$key_a')" lab_is_key "$key_a"
lab_expect_read "A's key is registered once (one nexus)" "$key_a " registrations

# --- a new path while A holds: registered with the current key ------------------------------------
add_nexus 1 || { lab_not_ok "the second nexus of A did not appear"; lab_done; exit; }
new_sd=$nexus_sd new_sg=$nexus_sg
lab_log "A's second nexus: $new_sd $new_sg"
lab_expect "the map takes the new path" map_over "$a_sd" "$new_sd"
lab_expect "A's daemon lists the new path" await 100 lists_device "$new_sg"
lab_expect "A's daemon registers it: A's key on both nexuses" await 100 keys_are "$key_a $key_a "
lab_expect_read "A's gate stays open" true bf_field A db gate_open
lab_expect "a write through the new path lands" lab_write "$new_sd" 16 "blkfence-lab node=A new path"

# --- a new path after A was fenced: not registered (S5) -------------------------------------------
lab_expect "B acquires db" bf_ctl B acquire db --timeout 30s
key_b=$(bf_field B db key)
lab_expect "B's status names its key ('$key_b')" lab_is_key "$key_b"
lab_expect "A's daemon reports fenced" bf_await A db state fenced
add_nexus 2 || { lab_not_ok "the third nexus of A did not appear"; lab_done; exit; }
third_sd=$nexus_sd third_sg=$nexus_sg
lab_log "A's third nexus: $third_sd $third_sg"
lab_expect "the map takes the third path" map_over "$a_sd" "$new_sd" "$third_sd"
lab_expect "A's daemon lists the third path" await 100 lists_device "$third_sg"
lab_expect "A's daemon finishes 3 more monitor rounds" bf_await_checks A db 3
lab_expect_read "S5: only B's key is registered" "$key_b " registrations
lab_expect_eq "the target refuses a write through the third path" \
  "$(lab_write "$third_sd" 17 "blkfence-lab node=A third path")" "Invalid exchange"
lab_expect "A's log says the path was not registered" grep -q "not registered: this node does not hold" "$BF/A/log"
lab_done

#!/bin/bash
# Proves udev/69-blkfence.rules on real LIO LUs, next to the distribution's own rules: with the rule
# installed in the guest's /etc/udev/rules.d (the guest root is a tmpfs overlay), `udevadm test`
# of every node's sd and sg node of each LU names them /dev/blkfence/wwn/WWN/H:C:T:L.sd and .sg,
# with WWN and H:C:T:L as the lab's map says, and the links it creates resolve to the map's nodes;
# two nodes' paths to one LU share its directory; a partition gets no name; a remove event takes a
# path's link away; and a dm-multipath map built over both nodes' paths of LU 0, with the UUID
# multipath would give it (mpath- + scsi_id's ID_SERIAL, "3" + the NAA digits), is named
# /dev/blkfence/mpath/ID_SERIAL (without dm_multipath that check fails, as
# tests/lab/daemon/hotplug.sh does). There is no udevd in the guest: `udevadm test` runs the rules
# itself. Leaves no partition table and no map behind.
#   usage: udev.sh [LU...]     (default: LUs 0 and 1, or 0 alone in a one-LU topology)
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
if (($#)); then lus=("$@"); elif ((LAB_LUNS > 1)); then lus=(0 1); else lus=(0); fi
install -m 0644 "$BLKFENCE_LAB_REPO/udev/69-blkfence.rules" /etc/udev/rules.d/ || exit 1

# blkfence_links ACTION SYSPATH: runs the rules; prints the device's /dev/blkfence links, sorted,
# space-separated ("" for none). Fails, with the reason on stderr, when `udevadm test` fails or
# prints no properties for the device (no name is then not "no name"), or when the rule file itself
# has diagnostics.
blkfence_links() {
  local out rc diag links
  out=$(udevadm test --action="$1" "$2" 2>&1)
  rc=$?
  if ((rc != 0)) || [[ $out != *$'\n'"DEVPATH="* ]]; then
    echo "udevadm test --action=$1 $2 exited $rc without the device's properties: ${out: -300}" >&2
    return 1
  fi
  diag=$(grep '^/etc/udev/rules.d/69-blkfence.rules:' <<<"$out")
  if [[ -n $diag ]]; then
    echo "69-blkfence.rules has diagnostics: $(sort -u <<<"$diag" | tr '\n' ' ')" >&2
    return 1
  fi
  links=$(sed -n 's/^DEVLINKS=//p' <<<"$out" | tr ' ' '\n')
  links=$(grep '^/dev/blkfence/' <<<"$links")  # no match is "no links", grep's exit 1
  [[ -z $links ]] || sort <<<"$links" | tr '\n' ' '
}

for lu in "${lus[@]}"; do
  for ((n = 1; n <= LAB_NODES; n++)); do
    node=$(lab_node_name "$n")
    sd=$(lab_dev "$node" "$lu" sd) && sg=$(lab_dev "$node" "$lu" sg) &&
      wwn=$(lab_dev "$node" "$lu" wwn) && hctl=$(lab_dev "$node" "$lu" hctl) || exit 1
    dir=/dev/blkfence/wwn/$wwn
    lab_log "node $node, LU $lu: $sd and $sg ($hctl, $wwn)"
    lab_expect_read "$node/$lu: $sd is named $dir/$hctl.sd" "$dir/$hctl.sd " \
      blkfence_links add "/sys/class/block/${sd#/dev/}"
    lab_expect_read "$node/$lu: $sg is named $dir/$hctl.sg" "$dir/$hctl.sg " \
      blkfence_links add "/sys/class/scsi_generic/${sg#/dev/}"
    lab_expect_eq "$node/$lu: $dir/$hctl.sd resolves to $sd" "$(readlink -f "$dir/$hctl.sd")" "$sd"
    lab_expect_eq "$node/$lu: $dir/$hctl.sg resolves to $sg" "$(readlink -f "$dir/$hctl.sg")" "$sg"
  done
  lab_expect_eq "LU $lu: one entry per node and node type in $dir" \
    "$(find "$dir" -type l | wc -l)" "$((2 * LAB_NODES))"
done

# A partition: one MBR entry (type 0x83, LBA 2048, 2048 sectors) written to A's path of the first
# LU, re-read by the kernel, then wiped again. Python writes it: one process, not a dd per field.
sd=$(lab_dev A "${lus[0]}")
if python3 - "$sd" <<'EOF' && blockdev --rereadpt "$sd" && [[ -e /sys/class/block/${sd#/dev/}1 ]]; then
import os, struct, sys
mbr = bytearray(512)
mbr[446:462] = struct.pack("<B3sB3sII", 0, b"\0\0\0", 0x83, b"\0\0\0", 2048, 2048)
mbr[510:512] = b"\x55\xaa"
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, bytes(mbr), 0)
os.fsync(fd)
os.close(fd)
EOF
  lab_expect_read "${sd}1, a partition, gets no name" "" blkfence_links add "/sys/class/block/${sd#/dev/}1"
  dd if=/dev/zero of="$sd" bs=512 count=1 conv=notrunc,fsync status=none && blockdev --rereadpt "$sd"
  lab_expect_eq "the partition table is gone again" "$([[ -e /sys/class/block/${sd#/dev/}1 ]] && echo left)" ""
else
  lab_not_ok "could not create a partition on $sd (a reservation left by an earlier check?)"
fi

# A remove event takes the path's link away and leaves the other paths'.
wwn=$(lab_dev A "${lus[0]}" wwn) hctl=$(lab_dev A "${lus[0]}" hctl)
udevadm test --action=remove "/sys/class/block/${sd#/dev/}" >/dev/null 2>&1
lab_expect_eq "remove: A's link is gone, the other $((2 * LAB_NODES - 1)) stay" \
  "$([[ -e /dev/blkfence/wwn/$wwn/$hctl.sd ]] && echo left) $(find "/dev/blkfence/wwn/$wwn" -type l | wc -l)" \
  " $((2 * LAB_NODES - 1))"

# dm-multipath over every node's path of the first LU, named the way multipathd names it. Without
# dm_multipath the check fails, as tests/lab/daemon/hotplug.sh fails: never skipped in silence.
if ! modprobe dm_multipath || ! modprobe dm_round_robin; then
  lab_not_ok "the multipath naming check needs dm_multipath and dm_round_robin, which do not load"
else
  lu=${lus[0]}
  serial=$(/lib/udev/scsi_id --whitelisted --device="$(lab_dev A "$lu")")
  lab_expect_eq "scsi_id's ID_SERIAL (multipath's WWID) is 3 + the NAA digits of sysfs' wwid" \
    "$serial" "3${wwn#naa.}"
  paths="" size=$(cat "/sys/class/block/${sd#/dev/}/size")
  for ((n = 1; n <= LAB_NODES; n++)); do
    dev=$(lab_dev "$(lab_node_name "$n")" "$lu")
    paths+=" $(cat "/sys/class/block/${dev#/dev/}/dev") 1"
  done
  table="0 $size multipath 0 0 1 1 round-robin 0 $LAB_NODES 1$paths"
  if dmsetup create blkfence-lab-mpath --noudevsync --uuid "mpath-$serial" --table "$table"; then
    dm=$(basename "$(readlink -f /sys/dev/block/"$(dmsetup info -c --noheadings -o major,minor --separator : blkfence-lab-mpath)")")
    lab_log "multipath map $dm over$paths, uuid mpath-$serial"
    lab_expect_read "$dm (DM_UUID mpath-$serial) is named /dev/blkfence/mpath/$serial" \
      "/dev/blkfence/mpath/$serial " blkfence_links add "/sys/class/block/$dm"
    lab_expect_eq "/dev/blkfence/mpath/$serial resolves to /dev/$dm" \
      "$(readlink -f "/dev/blkfence/mpath/$serial")" "/dev/$dm"
    udevadm test --action=remove "/sys/class/block/$dm" >/dev/null 2>&1
    lab_expect "the map is removed again" dmsetup remove blkfence-lab-mpath
  else
    lab_not_ok "dmsetup create of a multipath map over$paths failed"
  fi
fi
lab_done

# The lab guest booted by systemd (tests/lab/run --init systemd; sourced by guest/stage2 and
# guest/systemd-step after guest/job.sh; bash).
#
# The guest runs the host's own systemd (its root is the host's, read-only over 9p, under a tmpfs
# overlay). lab_systemd_boot writes the job's units into the overlay's /etc/systemd/system and
# execs /lib/systemd/systemd as PID 1 with blkfence-lab.target as its only goal:
#
#   blkfence-lab-topology.service  builds the LIO topology and the map (job.sh, as stage2 does)
#   blkfence-lab-install.service   installs blkfence as an operator would (lab_systemd_install)
#   blkfence-lab-test.service      runs the test command under the deadline watchdog, then powers
#                                  the guest off (job.sh)
#
# The goal is not multi-user.target, so none of the host's services (PostgreSQL, etcd, Patroni,
# corosync, pacemaker, gettys) is pulled in; what sysinit.target would start and a lab guest does
# not need (binfmt, the pstore, time sync, the iSCSI units, caches that "need an update"
# on a fresh overlay) is masked, so that the boot stays short under TCG. journald, udevd and the
# system bus run: the checks read the journal, the udev rule names the LUs, and blkfenced stops
# gated units over D-Bus.

lab_systemd_units=/etc/systemd/system
# Units of sysinit.target (or enabled on the host) that a lab guest does without. Among them
# systemd-tmpfiles-setup.service: it empties /tmp, which the guest's /tmp (the host's, or a
# repository cloned under it) must not be, and through the overlay that costs a minute and more.
lab_systemd_masked=(systemd-udev-trigger.service open-iscsi.service iscsid.service iscsid.socket
  iscsi.service systemd-timesyncd.service systemd-pstore.service systemd-random-seed.service
  systemd-binfmt.service proc-sys-fs-binfmt_misc.automount systemd-firstboot.service
  systemd-sysusers.service systemd-repart.service systemd-pcrphase.service
  systemd-pcrphase-sysinit.service systemd-update-utmp.service systemd-machine-id-commit.service
  dev-hugepages.mount sys-kernel-debug.mount sys-kernel-tracing.mount sys-fs-fuse-connections.mount
  systemd-journal-flush.service ldconfig.service systemd-hwdb-update.service
  systemd-journal-catalog-update.service systemd-update-done.service systemd-sysctl.service systemd-tmpfiles-setup.service)

# lab_systemd_unit NAME: writes the unit NAME from stdin into the overlay's unit directory.
lab_systemd_unit() { cat >"$lab_systemd_units/$1"; }

# lab_systemd_rebooted: this is a boot after a reboot of the guest (tests/lab/run --reboots): its
# disk holds what the last boot installed, enabled and wrote.
lab_systemd_rebooted() { ((${LAB_BOOT:-1} > 1)); }

# lab_systemd_multi_user_masks: the units the host's root enables for multi-user.target, but for
# blkfence's own and the system bus, and timers.target: what a boot after a reboot masks so that
# multi-user.target, its goal as a node's, starts the units the guest enabled (blkfenced.service)
# and none of the host's services (PostgreSQL, etcd, corosync, gettys, daily timers).
lab_systemd_multi_user_masks() {
  local link
  echo timers.target
  for link in /etc/systemd/system/multi-user.target.wants/* /lib/systemd/system/multi-user.target.wants/*; do
    [[ -e $link || -L $link ]] || continue
    case ${link##*/} in
      blkfenced.service | dbus.service) ;;
      *) echo "${link##*/}" ;;
    esac
  done
}

lab_systemd_boot() {
  local step=$LAB_REPO/tests/lab/guest/systemd-step unit
  # The host may be a container: systemd would take the guest for one too (/.dockerenv, found in
  # the host's root) and skip what it skips in containers, udevd among them.
  rm -f /.dockerenv /run/.containerenv
  # A fresh /tmp, unless the repository lives there (as stage2 does).
  [[ $LAB_REPO/ == /tmp/* ]] || mount -t tmpfs -o mode=1777 tmpfs /tmp || return 1
  mkdir -p "$lab_systemd_units" || return 1
  local -a masked=("${lab_systemd_masked[@]}")
  # After a reboot the goal also wants multi-user.target, and the test runs once it is reached: what
  # the guest enabled before the reboot has started by itself, as on a node.
  # (No process substitution here: this runs before anything made /dev/fd.)
  local multi_user="" more
  if lab_systemd_rebooted; then
    multi_user=multi-user.target
    more=$(lab_systemd_multi_user_masks) || return 1
    # shellcheck disable=SC2206 # unit names, one a line, without blanks
    masked+=($more)
  fi
  for unit in "${masked[@]}"; do
    ln -sf /dev/null "$lab_systemd_units/$unit" || return 1
  done
  lab_systemd_unit blkfence-lab.target <<UNIT || return 1
[Unit]
Description=blkfence lab job
Requires=blkfence-lab-test.service
After=blkfence-lab-test.service
${multi_user:+Wants=$multi_user}
UNIT
  # Without the default dependencies the topology is built while sysinit.target comes up; its
  # devices are named by udev later (the install step triggers udev).
  # The LUs are there before blkfenced starts, as a node's SAN paths are (blkfenced orders itself
  # after the iSCSI login units): ordering only, for a boot that starts blkfenced by itself.
  lab_systemd_unit blkfence-lab-topology.service <<UNIT || return 1
[Unit]
Description=blkfence lab: the LIO topology and the map
DefaultDependencies=no
Wants=sys-kernel-config.mount
After=systemd-journald.socket sys-kernel-config.mount
Before=blkfenced.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$step topology
UNIT
  lab_systemd_unit blkfence-lab-install.service <<UNIT || return 1
[Unit]
Description=blkfence lab: install the product
Requires=blkfence-lab-topology.service systemd-udevd.service
After=blkfence-lab-topology.service systemd-udevd.service systemd-tmpfiles-setup.service
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$step install
UNIT
  # The test command has its own deadline (job.sh), so systemd's start timeout is off.
  lab_systemd_unit blkfence-lab-test.service <<UNIT || return 1
[Unit]
Description=blkfence lab: the test command
Requires=blkfence-lab-install.service dbus.socket
After=blkfence-lab-install.service dbus.socket $multi_user
[Service]
Type=oneshot
ExecStart=$step test
TimeoutStartSec=infinity
UNIT
  exec /lib/systemd/systemd --unit=blkfence-lab.target
}

# lab_systemd_install: blkfence installed into the guest's overlay as an operator installs it:
# the Debian package named by BLKFENCE_LAB_DEB (a .deb, or a directory holding exactly one
# blkfence_*.deb, as packaging.deb leaves it) with dpkg -i, or else `cmake --install` of the
# build tree BLKFENCE_LAB_BUILD with the prefix it was configured with (the unit and the drop-in
# name the binaries by that prefix: docs/operations.md installs into /usr/local). Then the
# service manager, tmpfiles and udev take the new files in, and udev names the LUs.
lab_systemd_install() {
  local deb=${BLKFENCE_LAB_DEB:-}
  if lab_systemd_rebooted; then
    echo "lab: boot $LAB_BOOT: blkfence is installed on the guest's disk since boot 1"
    return 0
  fi
  if [[ -d $deb ]]; then
    local debs=("$deb"/blkfence_*.deb)
    if ((${#debs[@]} != 1)) || [[ ! -f ${debs[0]} ]]; then
      echo "lab: want exactly one blkfence_*.deb in $deb, found: ${debs[*]}" >&2
      return 1
    fi
    deb=${debs[0]}
  fi
  if [[ -n $deb ]]; then
    echo "lab: installing $deb"
    DEBIAN_FRONTEND=noninteractive dpkg -i "$deb" || return 1
  else
    cmake --install "${BLKFENCE_LAB_BUILD:?BLKFENCE_LAB_BUILD names the build tree to install}" || return 1
  fi
  systemctl daemon-reload &&
    systemd-tmpfiles --create blkfence.conf &&
    udevadm control --reload &&
    udevadm trigger --action=change --subsystem-match=block --subsystem-match=scsi_generic &&
    udevadm settle --timeout=60
}

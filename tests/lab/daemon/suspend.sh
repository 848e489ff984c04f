#!/bin/bash
# The lease runs across a system suspend (issue 12; docs/protocol.md, "Monitor"): blkfenced counts
# it on CLOCK_BOOTTIME, so a suspend longer than the lease closes a holder's gate (lost-contact) as
# soon as the daemon runs again, and the next good check reopens it; on CLOCK_MONOTONIC the daemon
# would see no gap and report nothing.
#
# The suspend is the kernel's test mode (pm_test=core: the whole suspend path down to the
# timekeeping, DELAY_S seconds with the clocks stopped, then the resume), which needs no wake
# source. After a resume every access to the guest's virtio-9p shares (its root, /lab/out) hangs:
# virtio-pci resets the device and 9p has no restore. So this script, which runs from 9p, only
# prepares: it copies bash, blkfenced, blkfencectl and dmesg with their libraries onto a tmpfs of
# their own, writes node A's configuration there (lease LEASE_S, checks every 500 ms, run_dir and
# state_dir on that tmpfs) and runs suspend_chroot.sh chrooted into it, where nothing can reach 9p.
# That half reports on the console and ends with "lab: exit status N"; the runner judges the boot
# from console.log (tests/lab/run --verdict-from-console).
#   usage: suspend.sh LU [DELAY_S [LEASE_S]]
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
lu=${1:?usage: suspend.sh LU [DELAY_S [LEASE_S]]} delay_s=${2:-10} lease_s=${3:-5}
root=/run/blkfence-suspend

fail() { lab_not_ok "$*"; lab_done; exit 1; }

dev=$(lab_dev A "$lu" sg) || fail "LU $lu of node A is in the map"
[[ -w /sys/power/pm_test && -w /sys/module/suspend/parameters/pm_test_delay ]] ||
  fail "the guest kernel has the suspend test mode (/sys/power/pm_test, CONFIG_PM_DEBUG)"
mkdir -p "$root" && mount -t tmpfs -o mode=755 tmpfs "$root" || fail "mounting a tmpfs on $root"
mkdir -p "$root"/{bin,dev,etc,proc,run,state,sys,tmp} || fail "creating the chroot's directories"

# copy PROGRAM: the program into /bin of the chroot and the libraries it loads (and the loader, an
# absolute path in ldd's list) under their own paths, which the loader searches.
copy() {
  local path libs lib
  path=$(command -v "$1") || { echo "no program $1"; return 1; }
  cp "$path" "$root/bin/" || return 1
  libs=$(ldd "$path" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }') ||
    { echo "ldd $path failed"; return 1; }
  for lib in $libs; do
    cp -L --parents "$lib" "$root" || return 1
  done
}
for program in bash "$BLKFENCED" "$BLKFENCECTL" dmesg; do
  copy "$program" || fail "copying $program and its libraries into $root"
done
cp "$BLKFENCE_LAB_REPO/tests/lab/daemon/suspend_chroot.sh" "$root/suspend_chroot.sh" &&
  mkfifo "$root/nap" || fail "copying the chroot's script"
cat >"$root/etc/blkfence.toml" <<TOML || fail "writing the configuration"
cluster = "lab"
node_id = 1
state_dir = "/state"
run_dir = "/run"

[[resource]]
name = "db"
devices = ["$dev"]
preempt = "preempt"
check_interval = "500ms"
lease = "${lease_s}s"
command_timeout = "2s"
on_fenced = "none"
TOML
mount -t devtmpfs devtmpfs "$root/dev" && mount -t proc proc "$root/proc" &&
  mount -t sysfs sysfs "$root/sys" || fail "mounting /dev, /proc and /sys in $root"
# "mem" is suspend to RAM (deep), where the test mode stops at the core; suspend to idle would
# wait for a wake source, which the guest has none of.
[[ $(</sys/power/mem_sleep) == *deep* ]] && echo deep >/sys/power/mem_sleep &&
  echo "$delay_s" >/sys/module/suspend/parameters/pm_test_delay && echo core >/sys/power/pm_test ||
  fail "setting the suspend test mode (suspend to RAM, core, ${delay_s}s)"
# For the kernel's "Timekeeping suspended for ... seconds", which the report quotes.
echo 1 >/sys/power/pm_debug_messages || fail "enabling the suspend's debug messages"
lab_ok "bash, blkfenced, blkfencectl and dmesg are copied into $root, with node A's configuration ($dev, lease ${lease_s}s)"

# The LU starts without registrations, as every daemon check's.
lab_expect "the LU is cleared first" lab_pr --out --register-ignore --param-sark=0x1 "$dev"
lab_expect "... and has no reservation or key left" lab_pr --out --clear --param-rk=0x1 "$dev"
((lab_checks_failed == 0)) || { lab_done; exit 1; }
echo "the rest of this check reports on the console"
export LANG=C
exec chroot "$root" /bin/bash /suspend_chroot.sh "$delay_s" "$lease_s" </dev/null >/dev/console 2>&1

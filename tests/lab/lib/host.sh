# Host side of the lab: fetch and cache the guest kernel, build the initramfs, boot qemu.
#
# Sourced by tests/lab/run, tests/lab/shell and tests/lab/demo. Every failure ends in one line that
# says what failed and where to look, and a non-zero exit (lab_die). Nothing is installed on the
# host: the kernel package is unpacked into a cache under the build tree and reused.

lab_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
lab_cache=${BLKFENCE_LAB_CACHE:-$lab_repo/build/lab-cache}

# Exit status the runner uses when the lab cannot run at all; ctest reports it as skipped.
readonly lab_exit_skip=77
# Exit status when the watchdog ended the test (mirrors timeout(1)).
readonly lab_exit_watchdog=124
# Exit status when the guest kernel reported itself wedged (soft lockup, hung task, RCU stall).
readonly lab_exit_wedged=125

# The guest kernel's own lockup detectors, and what they do (kernel command line; "sysctl." sets a
# sysctl at boot). Each prints the stuck task's backtrace and every CPU's, then panics, and the
# panic ends qemu (panic=1 with -no-reboot): a wedged guest costs a minute, not the host's timeout.
# A hung task is one in state D for 30 s, checked every 5 s. loglevel=5 puts backtraces (printed
# at the default level, 4) on the console as they happen but keeps info lines off it (a writer
# refused by a reservation logs one per write, which at serial speed under TCG would slow the guest
# down). On panic the kernel prints every CPU's backtrace (panic_print 64: an RCU stall panics
# right after the CPU that saw it) and then its whole log again at every level (panic_print 32),
# the hung task's stack (info level) and LIO's messages before the wedge included. The in-guest
# deadline watchdog (stage2) covers a test that hangs in user space.
readonly lab_kernel_watch=(loglevel=5 sysctl.kernel.softlockup_panic=1
  sysctl.kernel.softlockup_all_cpu_backtrace=1 sysctl.kernel.hung_task_timeout_secs=30
  sysctl.kernel.hung_task_check_interval_secs=5 sysctl.kernel.hung_task_panic=1
  sysctl.kernel.hung_task_all_cpu_backtrace=1 sysctl.kernel.panic_on_rcu_stall=1
  sysctl.kernel.panic_print=96)
# Console lines with which the guest kernel says it is wedged.
readonly lab_wedge_lines='BUG: soft lockup|blocked for more than [0-9]+ seconds|rcu: INFO: .*stall|self-detected stall|watchdog: Watchdog detected hard LOCKUP'
# After the first such line, how long the guest may go on printing backtraces and panicking before
# the host stops it (a CPU spinning with interrupts off cannot panic).
readonly lab_wedge_grace_s=45

lab_say() { printf 'lab: %s\n' "$*" >&2; }
lab_die() { printf 'lab: error: %s\n' "$*" >&2; exit 1; }

# The qemu binary, or skip with the reason when the machine has none.
lab_require_qemu() {
  if ! command -v qemu-system-x86_64 >/dev/null; then
    lab_say "skipped: qemu-system-x86_64 is not installed (tests/run installs it: apt-get install qemu-system-x86)"
    exit "$lab_exit_skip"
  fi
  # grep without -q reads the whole list: with -q it may exit first and busybox's SIGPIPE fails
  # the pipeline under pipefail (seen once, a flaky 'missing' error).
  command -v busybox >/dev/null && busybox --list | grep -x switch_root >/dev/null ||
    lab_die "busybox with switch_root is missing (apt-get install busybox-static)"
}

# Debian's stock kernel, unpacked under $lab_cache/kernel/<version>. Sets lab_kver, lab_kroot.
# The versioned package is the one linux-image-amd64 depends on; the cache is reused when apt has
# nothing newer, and when apt's lists are unavailable the newest cached kernel is used.
lab_fetch_kernel() {
  local pkg
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [[ -z $pkg ]]; then
    local cached
    cached=$(ls -d "$lab_cache"/kernel/*/ready 2>/dev/null | sort -V | tail -n 1)
    [[ -n $cached ]] || lab_die "cannot find the kernel package linux-image-amd64 (run 'apt-get update'; apt-cache depends linux-image-amd64 printed nothing)"
    pkg=linux-image-$(basename "$(dirname "$cached")")
  fi
  lab_kver=${pkg#linux-image-}
  lab_kroot=$lab_cache/kernel/$lab_kver
  [[ -e $lab_kroot/ready ]] && return 0

  lab_say "downloading $pkg (once; cached in $lab_kroot)"
  local tmp=$lab_cache/kernel/.download
  rm -rf "$tmp" "$lab_kroot" && mkdir -p "$tmp" "$lab_kroot"
  # apt-get download as root warns that _apt cannot write here; the download itself works.
  (cd "$tmp" && apt-get download "$pkg" >"$tmp/apt.log" 2>&1) ||
    lab_die "apt-get download $pkg failed; see $tmp/apt.log"
  dpkg -x "$tmp"/"$pkg"_*.deb "$lab_kroot" || lab_die "dpkg -x of $pkg failed (in $tmp)"
  [[ -f $lab_kroot/boot/vmlinuz-$lab_kver ]] || lab_die "$pkg has no boot/vmlinuz-$lab_kver"
  depmod -b "$lab_kroot" "$lab_kver" || lab_die "depmod -b $lab_kroot $lab_kver failed"
  rm -rf "$tmp"
  touch "$lab_kroot/ready"
}

# Prints the modules needed to load the given ones, dependencies first, from modules.dep.
lab_module_order() {
  local dep=$lab_kroot/lib/modules/$lab_kver/modules.dep
  awk -v want="$*" '
    { sub(":", "", $1); name = $1; sub(".*/", "", name); sub("\\.ko.*$", "", name)
      path[name] = $1; deps[name] = ""
      for (i = 2; i <= NF; i++) { d = $i; sub(".*/", "", d); sub("\\.ko.*$", "", d); deps[name] = deps[name] " " d } }
    function visit(m,   n, list, i) {
      if (m in seen) return; seen[m] = 1
      if (!(m in path)) { missing = missing " " m; return }
      n = split(deps[m], list, " ")
      for (i = n; i >= 1; i--) visit(list[i])
      print path[m]
    }
    END { n = split(want, w, " "); for (i = 1; i <= n; i++) visit(w[i])
          if (missing != "") { print "missing modules:" missing > "/dev/stderr"; exit 1 } }' "$dep"
}

# The initramfs: static busybox, the stage-1 init, and the virtio/9p/overlay modules in load order;
# and, loaded only for a boot with a disk (tests/lab/run --reboots), virtio_blk and ext4 with
# crc32c, which ext4 asks the crypto API for (no modprobe in stage 1 to load it on demand).
# Sets lab_initrd. Rebuilt when the kernel or the init script changes.
lab_build_initramfs() {
  local init=$lab_repo/tests/lab/guest/init
  local stamp
  stamp=$(cat "$init" /bin/busybox | sha256sum | cut -c1-16)
  lab_initrd=$lab_cache/initramfs-$lab_kver-$stamp.cpio.gz
  [[ -f $lab_initrd ]] && return 0

  local dir=$lab_cache/initramfs.build
  rm -rf "$dir" && mkdir -p "$dir"/{bin,dev,proc,sys,modules,mnt}
  cp /bin/busybox "$dir/bin/busybox"
  cp "$init" "$dir/init" && chmod 755 "$dir/init"
  local order
  order=$(lab_module_order virtio_pci 9pnet_virtio 9p overlay) || lab_die "module dependencies not found in $lab_kroot"
  local disk_order
  disk_order=$(lab_module_order crc32c_generic virtio_blk ext4 | grep -vxF -f <(echo "$order")) ||
    lab_die "disk module dependencies not found in $lab_kroot"
  local mod
  for mod in $order; do
    cp "$lab_kroot/lib/modules/$lab_kver/$mod" "$dir/modules/"
    basename "$mod" >>"$dir/modules/order"
  done
  for mod in $disk_order; do
    cp "$lab_kroot/lib/modules/$lab_kver/$mod" "$dir/modules/"
    basename "$mod" >>"$dir/modules/order.disk"
  done
  (cd "$dir" && find . | cpio -o -H newc --quiet | gzip -1 >"$lab_initrd.tmp") ||
    lab_die "building the initramfs failed (in $dir)"
  mv "$lab_initrd.tmp" "$lab_initrd"
  rm -rf "$dir"
}

# lab_make_disk OUT_DIR: the guest's disk for a boot that reboots (tests/lab/run --reboots): a
# sparse ext4 image, OUT_DIR/disk.img, on which stage 1 puts the overlay's writable layer. Created
# on the host, so the guest's stage 1 needs no mkfs.
lab_make_disk() {
  local image=$1/disk.img
  truncate -s 2G "$image" && mkfs.ext4 -q -F -L blkfence-lab "$image" ||
    lab_die "creating the guest's disk $image failed (mkfs.ext4 is in e2fsprogs)"
}

# lab_accel: kvm when /dev/kvm is there and the lab's kernel actually boots on it, else tcg;
# BLKFENCE_LAB_ACCEL=tcg|kvm overrides. Some hosts expose a /dev/kvm that cannot run this guest:
# nested virtualisation refusing an MSR makes qemu abort at once, or the guest hang in the firmware
# with qemu still running (so "still running after 3 s" proves nothing). The probe boots the lab's
# kernel with no initramfs and waits up to 10 s for its banner on the serial console; under KVM it
# prints it within a second, then panics for want of a root file system and qemu exits.
lab_accel() {
  if [[ -n ${BLKFENCE_LAB_ACCEL:-} ]]; then
    echo "$BLKFENCE_LAB_ACCEL"
    return
  fi
  [[ -r /dev/kvm && -w /dev/kvm ]] || { echo tcg; return; }
  local console accel=tcg
  console=$(mktemp)
  # bash reports a child killed by SIGABRT on its own stderr: silenced around the whole command.
  { timeout 10 qemu-system-x86_64 -machine q35,accel=kvm -cpu max -m 256 -nodefaults -display none \
    -no-reboot -serial "file:$console" -kernel "$lab_kroot/boot/vmlinuz-$lab_kver" \
    -append "console=ttyS0 panic=-1" </dev/null >/dev/null 2>&1; } 2>/dev/null
  grep -aq "Linux version" "$console" && accel=kvm
  rm -f "$console"
  echo "$accel"
}

# The line with which a guest that cannot write its status to the results share ends its report on
# the console (tests/lab/run --verdict-from-console).
readonly lab_verdict_line='^lab: exit status [0-9]+'

# lab_boot OUT_DIR INTERACTIVE TIMEOUT_S [CONSOLE_VERDICT]: boots the guest with the host root
# read-only and OUT_DIR writable; OUT_DIR/job.env tells the guest what to do. With CONSOLE_VERDICT
# 1, qemu is stopped as soon as the console shows the verdict line. Returns qemu's exit status.
lab_boot() {
  local out=$1 interactive=$2 timeout_s=$3 console_verdict=${4:-0}
  local accel
  accel=$(lab_accel)
  local -a console=(-serial "file:$out/console.log")
  if [[ $interactive == 1 ]]; then console=(-serial mon:stdio); fi
  local -a qemu=(
    qemu-system-x86_64 -machine "q35,accel=$accel" -cpu max -smp 2 -m 2048
    -nodefaults -no-reboot -display none "${console[@]}"
    -kernel "$lab_kroot/boot/vmlinuz-$lab_kver" -initrd "$lab_initrd"
    -append "console=ttyS0 panic=1 ${lab_kernel_watch[*]}"
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=$out,mount_tag=labout,security_model=none,multidevs=remap"
  )
  if [[ -f $out/disk.img ]]; then
    qemu+=(-drive "file=$out/disk.img,if=virtio,format=raw,cache=writeback")
  fi
  lab_say "booting $lab_kver ($accel) with job $out/job.env"
  if [[ $interactive == 1 ]]; then
    "${qemu[@]}"
    return
  fi
  : >"$out/console.log"
  timeout --kill-after=10 "$timeout_s" "${qemu[@]}" </dev/null >"$out/qemu.log" 2>&1 &
  local qemu_pid=$! rc=0
  lab_watch_console "$out" "$qemu_pid" &
  local watcher=$! verdict_watcher=""
  if [[ $console_verdict == 1 ]]; then
    lab_await_verdict "$out" "$qemu_pid" &
    verdict_watcher=$!
  fi
  wait "$qemu_pid" || rc=$?
  kill "$watcher" $verdict_watcher 2>/dev/null
  wait "$watcher" $verdict_watcher 2>/dev/null
  return "$rc"
}

# lab_await_verdict OUT_DIR PID: stops PID (qemu under timeout) once the console shows the verdict
# line, unless the guest ends first.
lab_await_verdict() {
  local out=$1 pid=$2 line
  while IFS= read -r line; do
    if [[ $line =~ $lab_verdict_line ]]; then
      kill -TERM "$pid" 2>/dev/null
      return 0
    fi
  done < <(tail -n +1 -F --pid="$pid" "$out/console.log" 2>/dev/null)
}

# lab_console_verdict OUT_DIR: for a guest that reported on the console, writes OUT_DIR/status from
# its verdict line and appends its report (from "lab: console output follows" to the verdict) to
# OUT_DIR/test.log; does nothing when the console has no verdict line.
lab_console_verdict() {
  local out=$1 rc
  rc=$(awk '{ sub(/\r$/, "") } /^lab: exit status [0-9]+$/ { print $4; exit }' "$out/console.log")
  [[ -n $rc ]] || return 0
  awk '{ sub(/\r$/, "") } /^lab: console output follows$/ { on = 1 } on { print }
       /^lab: exit status [0-9]+$/ { exit }' "$out/console.log" >>"$out/test.log"
  echo "$rc" >"$out/status"
}

# lab_watch_console OUT_DIR PID: waits for the guest console to report a wedged kernel; then gives
# the guest lab_wedge_grace_s to print its backtraces and panic, and stops PID (qemu under timeout)
# if it has not ended by then.
lab_watch_console() {
  local out=$1 pid=$2 try
  # grep ends at the first match; tail follows the file until qemu is gone.
  tail -n +1 -F --pid="$pid" "$out/console.log" 2>/dev/null | grep -m 1 -E "$lab_wedge_lines" >/dev/null ||
    return 0
  for ((try = 0; try < lab_wedge_grace_s * 10; try++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  lab_say "the guest kernel is wedged and did not panic within ${lab_wedge_grace_s}s: stopping qemu"
  kill -TERM "$pid" 2>/dev/null
}

# lab_wedge_report OUT_DIR: when the console shows the guest kernel wedged, prints one line naming
# what the detector saw, where each CPU and blocked task was (lab_wedge_where), and the lab check
# that was running (test.log's last "=== " line and last check), and returns 0; else returns 1.
lab_wedge_report() {
  local out=$1 first cpus check last
  [[ -f $out/console.log ]] || return 1
  first=$(grep -a -m 1 -E "$lab_wedge_lines" "$out/console.log" | sed 's/^\[[ 0-9.]*\] *//; s/\r$//')
  [[ -n $first ]] || return 1
  cpus=$(lab_wedge_where <"$out/console.log")
  check=$(grep -a '^=== ' "$out/test.log" 2>/dev/null | tail -n 1 | cut -c5-)
  last=$(grep -a -E '^(ok|not ok) ' "$out/test.log" 2>/dev/null | tail -n 1)
  printf "the guest kernel is wedged: '%s'%s, during '%s'%s; backtraces in %s\n" "$first" \
    "${cpus:+ ($cpus)}" "${check:-the test command}" "${last:+ after '$last'}" "$out/console.log"
}

# lab_wedge_where < CONSOLE_LOG: where the wedged kernel's CPUs and blocked tasks were, from the
# backtraces the detectors print ("CPU: N PID: P Comm: TASK" for a CPU, "task:NAME state:D" for a
# blocked task): "CPU 0 TASK in F < G [module]; task NAME (state D) in F < G [module]", where G is
# the block's first call-trace frame in a module and F the function the CPU was interrupted in
# (its RIP line), else the frame just above G. Only the first backtrace of each CPU or task
# counts: on panic the kernel prints its whole log again.
lab_wedge_where() {
  awk '
    function flush() {
      if (who != "" && !(who in seen)) {
        seen[who] = 1
        where = rip != "" ? rip : (above != "" ? above : top)
        text = who (where != "" ? " in " where : "") (mod != "" && mod != where ? " < " mod : "")
        list = list (list == "" ? "" : "; ") text
      }
      who = ""; rip = ""; top = ""; prev = ""; above = ""; mod = ""
    }
    function frame(s) { sub(/^ +/, "", s); sub(/\+0x[0-9a-f]+\/0x[0-9a-f]+/, "", s); return s }
    { sub(/\r$/, ""); sub(/^\[[ 0-9.]*\] ?/, "") }
    /^CPU: [0-9]+ PID: [0-9]+ Comm: / { flush(); who = "CPU " $2 " " $6; next }
    /^task:[^ ]+ +state:D/ {
      flush(); name = $1; sub(/^task:/, "", name)
      who = "task " name " (state D)"; next
    }
    who == "" { next }
    /^(Kernel panic|NMI backtrace|INFO: task|watchdog: |rcu: )/ { flush(); next }
    /^RIP: [0-9a-f]+:/ { rip = frame(substr($0, index($0, ":") + 1)); sub(/^[0-9a-f]+:/, "", rip); next }
    /^ +[A-Za-z_][A-Za-z0-9_.]*\+0x/ {
      f = frame($0)
      if (top == "") top = f
      if (mod == "" && f ~ /\[[a-z0-9_]+\]$/) { mod = f; above = prev }
      prev = f
    }
    END { flush(); print list }'
}

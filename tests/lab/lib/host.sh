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

# The initramfs: static busybox, the stage-1 init, and the virtio/9p/overlay modules in load order.
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
  local mod
  for mod in $order; do
    cp "$lab_kroot/lib/modules/$lab_kver/$mod" "$dir/modules/"
    basename "$mod" >>"$dir/modules/order"
  done
  (cd "$dir" && find . | cpio -o -H newc --quiet | gzip -1 >"$lab_initrd.tmp") ||
    lab_die "building the initramfs failed (in $dir)"
  mv "$lab_initrd.tmp" "$lab_initrd"
  rm -rf "$dir"
}

# lab_accel: kvm when /dev/kvm is there and a VM actually starts on it, else tcg;
# BLKFENCE_LAB_ACCEL=tcg|kvm overrides. Some hosts expose a /dev/kvm that cannot run this guest
# (nested virtualisation refusing an MSR: qemu aborts at once), so an empty VM is started first: if
# it is still running after 3 s, KVM works.
lab_accel() {
  if [[ -n ${BLKFENCE_LAB_ACCEL:-} ]]; then
    echo "$BLKFENCE_LAB_ACCEL"
    return
  fi
  [[ -r /dev/kvm && -w /dev/kvm ]] || { echo tcg; return; }
  local rc=0
  # bash reports a child killed by SIGABRT on its own stderr: silenced around the whole command.
  { timeout 3 qemu-system-x86_64 -machine q35,accel=kvm -cpu max -m 256 -nodefaults -display none \
    -no-reboot </dev/null >/dev/null 2>&1 || rc=$?; } 2>/dev/null
  if ((rc == 124)); then echo kvm; else echo tcg; fi
}

# lab_boot OUT_DIR INTERACTIVE TIMEOUT_S: boots the guest with the host root read-only and OUT_DIR
# writable; OUT_DIR/job.env tells the guest what to do. Returns qemu's exit status.
lab_boot() {
  local out=$1 interactive=$2 timeout_s=$3
  local accel
  accel=$(lab_accel)
  local -a console=(-serial "file:$out/console.log")
  if [[ $interactive == 1 ]]; then console=(-serial mon:stdio); fi
  local -a qemu=(
    qemu-system-x86_64 -machine "q35,accel=$accel" -cpu max -smp 2 -m 2048
    -nodefaults -no-reboot -display none "${console[@]}"
    -kernel "$lab_kroot/boot/vmlinuz-$lab_kver" -initrd "$lab_initrd"
    -append "console=ttyS0 panic=1 loglevel=4"
    -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=$out,mount_tag=labout,security_model=none,multidevs=remap"
  )
  lab_say "booting $lab_kver ($accel) with job $out/job.env"
  if [[ $interactive == 1 ]]; then
    "${qemu[@]}"
  else
    timeout --kill-after=10 "$timeout_s" "${qemu[@]}" </dev/null >"$out/qemu.log" 2>&1
  fi
}

#!/bin/bash
# The second half of suspend.sh, run by its copy of bash chrooted into the tmpfs that suspend.sh
# filled (/bin: bash, blkfenced, blkfencectl, dmesg; /etc/blkfence.toml; /dev, /proc, /sys), so
# that nothing here touches virtio-9p, which hangs after the resume. Only bash builtins and those
# programs run (no /dev/fd here, so no process substitution); a pause is a read that times out on
# a FIFO nobody writes.
#   1. node A's daemon starts and acquires db; its gate is open and it has not lost contact;
#   2. the machine suspends for DELAY_S seconds (pm_test=core, set by suspend.sh), longer than the
#      lease LEASE_S;
#   3. after the resume the daemon logs lost-contact ("no successful check for the lease"), stamped
#      after the suspend began, once; its next check reopens the gate (contact-restored): A still
#      holds db with the same key.
# Reports on stdout (the console), ends with "lab: exit status N" (the runner's verdict,
# tests/lab/run --verdict-from-console) and powers the machine off.
#   usage: suspend_chroot.sh DELAY_S LEASE_S
set -u -o pipefail
delay_s=$1 lease_s=$2
export PATH=/bin BLKFENCE_SOCKET=/run/control.sock
log=/blkfenced.log
passed=0 failed=0

ok() { passed=$((passed + 1)); printf 'ok - %s\n' "$*"; }
not_ok() { failed=$((failed + 1)); printf 'not ok - %s\n' "$*"; }
exec {nap_fd}<>/nap
nap() { read -r -t "$1" -u "$nap_fd" _; }

# The verdict. The runner stops qemu when it sees the marker; the power-off is for one that does
# not wait for it.
finish() {
  printf '%d passed, %d failed\n' "$passed" "$failed"
  ((failed == 0 && passed > 0)) && rc=0 || rc=1
  echo "lab: exit status $rc"
  nap 5
  echo o >/proc/sysrq-trigger
  nap 60
  exit "$rc"
}

# Microseconds from a decimal number of seconds with up to 6 places (EPOCHREALTIME, /proc/uptime,
# the daemon's log stamps).
usec() {
  local whole=${1%.*} frac=000000
  [[ $1 == *.* ]] && frac=${1#*.}000000
  echo $((10#$whole * 1000000 + 10#${frac:0:6}))
}

# log_line TEXT: the first line of the daemon's log holding TEXT; fails when there is none.
log_line() {
  local line
  while IFS= read -r line; do
    [[ $line == *"$1"* ]] && { printf '%s\n' "$line"; return 0; }
  done <"$log"
  return 1
}

# await_log_line TEXT SECONDS: waits until the daemon's log holds TEXT and prints that line.
await_log_line() {
  local end=$((SECONDS + $2))
  until log_line "$1"; do
    ((SECONDS < end)) || return 1
    nap 0.1
  done
}

# status_fields: "STATE GATE KEY" of db, from its line in `blkfencectl status db`.
status_fields() {
  local text name state gate key
  text=$(blkfencectl status db) || return 1
  while read -r name _ state gate key _; do
    [[ $name == db ]] && { echo "$state $gate $key"; return 0; }
  done <<<"$text"
  return 1
}

# gate_check: "open" or "closed", what `blkfencectl gate check db` answers.
gate_check() {
  blkfencectl gate check db >/dev/null 2>&1
  case $? in
    0) echo open ;;
    1) echo closed ;;
    *) echo "no answer" ;;
  esac
}

# lost_contact_total: the daemon's count of lost contacts of db (its metrics).
lost_contact_total() {
  local text name value
  text=$(blkfencectl metrics) || return 1
  while read -r name value; do
    [[ $name == 'blkfence_lost_contact_total{resource="db"}' ]] && { echo "$value"; return 0; }
  done <<<"$text"
  return 1
}

echo "lab: console output follows"
echo "=== the suspend check (in the chroot): delay ${delay_s}s, lease ${lease_s}s"

# --- 1. A holds db -------------------------------------------------------------------------------
blkfenced --config /etc/blkfence.toml --log stderr >>"$log" 2>&1 &
for ((try = 0; try < 200; try++)); do
  fields=$(status_fields 2>/dev/null) && [[ ${fields%% *} != unknown ]] && break
  nap 0.1
done
[[ ${fields:-} && ${fields%% *} != unknown ]] && ok "A's daemon starts" ||
  { not_ok "A's daemon starts: status '${fields:-}'"; finish; }
if out=$(blkfencectl acquire db --timeout 30s 2>&1); then ok "A acquires db"; else
  not_ok "A acquires db: $out"
  finish
fi
fields=$(status_fields) || fields="no status"
read -r state gate key <<<"$fields"
[[ $state == held && $gate == open && $key == 0x* ]] && ok "A holds db with $key, gate open" ||
  not_ok "A holds db: status '$fields'"
[[ $(gate_check) == open ]] && ok "gate check says open before the suspend" ||
  not_ok "gate check says open before the suspend: $(gate_check)"
log_line lost-contact >/dev/null && not_ok "no lost contact before the suspend: $(log_line lost-contact)" ||
  ok "no lost contact before the suspend"

# --- 2. the suspend ------------------------------------------------------------------------------
read -r up_before _ </proc/uptime
suspend_start=$EPOCHREALTIME
echo "# suspending (pm_test core, ${delay_s}s)"
echo mem >/sys/power/state
# shellcheck disable=SC2320 # echo's status is that of the write, which is the suspend
suspend_rc=$?
read -r up_after _ </proc/uptime
gate_after=$(gate_check)
boot_gap=$(($(usec "$up_after") - $(usec "$up_before")))
echo "# resumed (echo mem exited $suspend_rc): CLOCK_BOOTTIME moved $((boot_gap / 1000)) ms;" \
  "gate check right after the resume: $gate_after (racing the daemon's first turn: not judged)"
((boot_gap > lease_s * 1000000)) && ok "the suspend lasted longer than the lease on CLOCK_BOOTTIME" ||
  not_ok "the suspend lasted longer than the lease on CLOCK_BOOTTIME: $((boot_gap / 1000)) ms"

# --- 3. lost contact across it, then the gate reopens ----------------------------------------------
if line=$(await_log_line "lost-contact: no successful check for the lease" 10); then
  ok "A's daemon logs lost-contact after the resume: ${line#*] }"
  stamp=${line#*[} stamp=${stamp%%]*}
  (($(usec "$stamp") >= $(usec "$suspend_start"))) && ok "... stamped after the suspend began" ||
    not_ok "... stamped after the suspend began: $stamp, the suspend began at $suspend_start"
else
  not_ok "A's daemon logs lost-contact after the resume (no such line within 10 s)"
fi
line=$(await_log_line "contact-restored" 10) && ok "the next good check reopens the gate: ${line#*] }" ||
  not_ok "the next good check reopens the gate (no contact-restored within 10 s)"
end=$((SECONDS + 10))
until [[ $(gate_check) == open ]] || ((SECONDS >= end)); do nap 0.1; done
[[ $(gate_check) == open ]] && ok "gate check says open again" ||
  not_ok "gate check says open again: $(gate_check)"
fields=$(status_fields) || fields="no status"
[[ $fields == "held open $key" ]] && ok "A still holds db with $key" ||
  not_ok "A still holds db with $key: status '$fields'"
total=$(lost_contact_total) || total="unreadable"
[[ $total == 1 ]] && ok "one lost contact in the daemon's metrics" ||
  not_ok "one lost contact in the daemon's metrics: $total"

kernel_log=$(dmesg 2>&1)
while IFS= read -r line; do
  [[ $line == *"Timekeeping suspended"* || $line == *"PM: suspend"* ]] && echo "# kernel: $line"
done <<<"$kernel_log"
finish

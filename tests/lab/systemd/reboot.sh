#!/bin/bash
# blkfenced across a reboot of its node (issue 13), in a guest booted by systemd whose disk a
# reboot keeps (tests/lab/run --init systemd --reboots 1): the overlay's writable layer, and with
# it the installed package, /etc/blkfence, /var/lib/blkfence, LIO's /var/target and the LU files,
# is an ext4 disk image; the topology step of the second boot creates the backstores again from the
# same files with the same serials and gives LIO back the PR state it saved for APTPL.
# The runner runs this script once per boot ($BLKFENCE_LAB_BOOT).
#   boot 1: first the scripts FIRST... name (lab.systemd: node.sh, whose checks need a node booted
#           by systemd but no reboot; sharing the boot spares a boot, the topology and the install),
#           each in its own bash, its checks printed as it runs them; one that fails fails the boot.
#           Then node A's installed blkfenced.service, enabled, acquires resource db on every LU; its
#           REGISTERs carried APTPL (PTPL_A on every LU); then a real `systemctl reboot` (the
#           daemon stops as at any shutdown: gates close, the key keeps the LUs);
#   boot 2: the LUs are the same (the map: WWNs, serials, sg nodes), LIO kept A's registration and
#           reservation on every LU, /var/lib/blkfence/db.epoch is what it was, blkfenced.service
#           came up by itself (enabled: multi-user.target started it before this script), and it
#           adopted its key (docs/protocol.md, "Start and restart": the holder's key with the
#           persisted epoch): same key and epoch, held, no new acquire; then node B (a transient
#           unit, as in node.sh) preempts A with an epoch above every epoch before the reboot (S3).
# With /var/lib/blkfence on a tmpfs in boot 1 (the state not persisted), A does not adopt after
# the reboot (B's epoch still grows: the LUs show A's); with LIO's /var/target/pr on a tmpfs as
# well, B draws A's epoch again, and the S3 check fails.
#   usage: reboot.sh [FIRST...]   (FIRST: a script's path in the repository)
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/systemd/lib.sh"

# MESSAGE_ID of an acquire (daemon/log.h; docs/operations.md, "Read the state").
msg_acquired=5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a11
epoch_file=/var/lib/blkfence/db.epoch
# What boot 1 saw, for boot 2 (the results share is the same in both boots).
before=$BLKFENCE_LAB_OUT/before-reboot
lus=()
for ((lu = 0; lu < LAB_LUNS; lu++)); do lus+=("$lu"); done

# await_a_state STATE: waits (10 s) until A's resource db is in STATE.
await_a_state() {
  local until=$((SECONDS + 10)) got=""
  while ((SECONDS < until)); do
    got=$(a_field db state) && [[ $got == "$1" ]] && return 0
    sleep 0.2
  done
  echo "A's state is '$got', not '$1'"
  return 1
}

# acquired_this_boot: the acquired records blkfenced.service logged in this boot (an adoption is
# one too, saying so).
acquired_this_boot() { journalctl -b -u blkfenced "MESSAGE_ID=$msg_acquired" -o cat --no-pager; }

# lu_state: "KEYS| HOLDERS| PTPL_A" of every LU, read through node B's nexus.
lu_state() {
  local keys holders ptpl
  keys=$(bf_keys_everywhere "${lus[@]}") && holders=$(bf_holders_everywhere "${lus[@]}") &&
    ptpl=$(bf_ptpl_active_everywhere "${lus[@]}") || return 1
  echo "$keys| $holders| $ptpl"
}

# await_reboot: the reboot stops this script with the test unit; returns only if it did not.
await_reboot() {
  local until=$((SECONDS + 120))
  while ((SECONDS < until)); do sleep 1; done
  lab_not_ok "the guest did not reboot within 120 s of 'systemctl reboot'"
}

boot_1() {
  local first
  for first in "$@"; do
    lab_log "boot 1: $first first"
    if bash "$BLKFENCE_LAB_REPO/$first"; then
      lab_ok "$first: every check above passed"
    else
      lab_not_ok "$first: failed (its 'not ok' lines above)"
    fi
  done
  lab_log "boot 1: installed $(sd_prop blkfenced FragmentPath), blkfencectl $ctl"
  lab_expect "bf_clear: the LUs start without keys" bf_clear "${lus[@]}"
  mkdir -p /etc/blkfence "$before"
  config 1 none >/etc/blkfence/blkfence.toml
  lab_expect "systemctl enable blkfenced (the operator's step once the configuration is written)" \
    systemctl enable blkfenced.service
  lab_expect "systemctl start blkfenced" systemctl start blkfenced.service
  lab_expect "A acquires db" a_ctl acquire db --timeout 30s
  local key epoch state
  key=$(a_field db key) epoch=$(a_field db epoch)
  lab_expect "A's status names its key ('$key')" lab_is_key "$key"
  lab_log "A holds with $key (epoch $epoch)"
  lab_expect_read "A's key holds every LU, alone, with APTPL active (PTPL_A 1)" "$key | $key | 1 " lu_state
  lab_expect "the epoch file is written" test -s "$epoch_file"
  state=$(cat "$epoch_file" 2>/dev/null)
  lab_log "$epoch_file: '$state'"
  printf '%s\n' "$key" >"$before/key" && printf '%s\n' "$epoch" >"$before/epoch" &&
    printf '%s\n' "$state" >"$before/epoch-file" && cp "$BLKFENCE_LAB_MAP" "$before/map.tsv" ||
    lab_not_ok "saving boot 1's state in $before"
  journalctl -b -o short-monotonic --no-pager >"$BLKFENCE_LAB_OUT/journal-boot1.log" 2>&1
  if ((lab_checks_failed > 0)); then
    lab_done
    return 1
  fi
  lab_log "boot 1: $lab_checks_passed passed; rebooting the guest (systemctl reboot)"
  touch "$BLKFENCE_LAB_OUT/reboot" && sync
  # No "ok" line for it: the reboot may stop this script before it is printed.
  systemctl reboot || lab_not_ok "systemctl reboot failed"
  await_reboot
  lab_done
  return 1
}

boot_2() {
  local started_us uptime key epoch state
  read -r uptime _ </proc/uptime
  started_us=$(awk -v s="$uptime" 'BEGIN { printf "%d", s * 1000000 }')
  lab_log "boot 2: after the reboot"
  key=$(cat "$before/key") && epoch=$(cat "$before/epoch") && state=$(cat "$before/epoch-file") || {
    lab_not_ok "boot 1 left no state in $before"
    lab_done
    return 1
  }
  lab_expect "the LUs are the same: the map (WWNs, serials, sg nodes, H:C:T:L) as in boot 1" \
    cmp "$before/map.tsv" "$BLKFENCE_LAB_MAP"
  lab_expect_read "blkfenced.service is enabled" "enabled" systemctl is-enabled blkfenced.service
  lab_expect_read "blkfenced.service came up by itself" "active" sd_prop blkfenced ActiveState
  local entered
  entered=$(sd_prop blkfenced ActiveEnterTimestampMonotonic)
  lab_expect "... before this script began (started by the boot, not by the test)" \
    test "${entered:-0}" -gt 0 -a "${entered:-0}" -lt "$started_us"
  lab_expect_read "$epoch_file is what it was before the reboot" "$state" cat "$epoch_file"
  lab_expect_read "LIO kept A's registration and reservation on every LU (APTPL)" "$key | $key | 1 " lu_state
  lab_expect_key "A adopted its key" "$key" a_field db key
  lab_expect_read "... with the same epoch" "$epoch" a_field db epoch
  lab_expect_read "... and holds" "held" a_field db state
  lab_expect_read "... without an acquire in this boot: its one acquired record is the adoption" \
    "db: acquired: our key $key is the holder and only registrant on every LU: adopted" acquired_this_boot
  lab_expect "A's gate is open" a_ctl gate check db

  config 2 none 'state_dir = "/var/lib/blkfence-b"
run_dir = "/run/blkfence-b"' >/etc/blkfence/node-b.toml
  lab_expect "B starts (systemd-run, Type=notify)" systemd-run --unit=blkfenced-b --property=Type=notify \
    --property=NotifyAccess=main --property=RuntimeDirectory=blkfence-b --property=StateDirectory=blkfence-b \
    "$sbin/blkfenced" --config /etc/blkfence/node-b.toml
  lab_expect "B acquires db (preempts A)" b_ctl acquire db --timeout 30s
  local key_b epoch_b
  key_b=$(b_field db key) epoch_b=$(b_field db epoch)
  lab_log "B holds with $key_b (epoch $epoch_b)"
  lab_expect_read "B's key holds every LU, alone" "$key_b | $key_b | 1 " lu_state
  # S3: above A's epoch and above both epochs the file held before the reboot.
  local highest=$epoch e
  for e in $state; do ((e > highest)) && highest=$e; done
  lab_expect "B's epoch ($epoch_b) is above every epoch before the reboot ($highest)" \
    test "${epoch_b:-0}" -gt "$highest"
  lab_expect "A's monitor finds its key gone: A is fenced" await_a_state fenced
  systemctl stop blkfenced-b.service
  lab_done
}

case ${BLKFENCE_LAB_BOOT:-1} in
  1) boot_1 "$@" ;;
  2) boot_2 ;;
  *) echo "reboot.sh: boot ${BLKFENCE_LAB_BOOT} was not expected" && exit 1 ;;
esac

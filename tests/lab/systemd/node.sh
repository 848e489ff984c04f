#!/bin/bash
# blkfenced under systemd as an operator runs it (issue 13; systemd/README.md, docs/operations.md),
# in a guest booted by systemd with blkfence installed by `cmake --install` or `dpkg -i`
# (tests/lab/run --init systemd). Node A is the installed blkfenced.service itself, configured in
# /etc/blkfence/blkfence.toml with node A's paths; node B is a second blkfenced started by
# `systemd-run` as the transient unit blkfenced-b.service, with its own configuration, run_dir and
# state_dir. A writer unit, lab-writer.service (sleep), carries the gate drop-in installed as
# systemd/README.md says. Checks, in one boot:
#   1. the installed files are where systemd and udev read them, and the installed udev rule names
#      every node's path of every LU under /dev/blkfence/wwn/WWN/H:C:T:L.{sd,sg};
#   2. `systemctl start blkfenced` returns once READY: the state of every resource is known at
#      that moment (one status read, no retry), and the unit shows the daemon's STATUS= line;
#   3. the gate drop-in: the writer does not start while the gate is closed (ExecCondition: the
#      start is skipped, Result=exec-condition), starts after `blkfencectl acquire`; the journal
#      has the acquire with its BLKFENCE_* fields and MESSAGE_ID;
#   4. B preempts A: A's blkfenced stops the writer (on_fenced = "stop-units": a clean stop by
#      SIGTERM), `journalctl MESSAGE_ID=<fenced>` finds A's fenced record, and the writer does not
#      start again; A restarted after the fence does not adopt its lost key;
#   5. the same with on_fenced = "kill-units": the writer is killed by SIGKILL;
#   6. the watchdog (WatchdogSec=4s in a lab drop-in, to keep it short): A's daemon frozen with
#      SIGSTOP is aborted and restarted by systemd (NRestarts grows, a new MainPID); restarted while
#      it still holds, it adopts its key (same key and epoch, the gate open, the writer running);
#      frozen again while B preempts it, the restarted daemon does not adopt, and the writer,
#      bound to it, does not run while the gate is closed;
#   7. `systemctl reload` is refused (the unit has no ExecReload=: nothing is reloaded), SIGHUP
#      through `systemctl kill` is logged and ignored (same MainPID, no restart); `systemctl stop`
#      while an acquire is held up (A's SCSI host in recovery holds its commands) ends the daemon
#      cleanly, and no PR OUT reaches the LU after it (its PR generation unchanged once the host
#      runs again and the held commands are done); systemd removes /run/blkfence; the epoch file
#      stays.
# lab.systemd runs it in the first boot of tests/lab/systemd/reboot.sh, before that script's own checks.
#   usage: node.sh
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/systemd/lib.sh"

# MESSAGE_IDs of daemon/log.h (docs/operations.md, "Read the state").
msg_acquired=5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a11
msg_fenced=5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a13
watchdog_s=4
lus=()
for ((lu = 0; lu < LAB_LUNS; lu++)); do lus+=("$lu"); done

# journal_fields MATCH...: the first journal record matching, as "UNIT RESOURCE KEY EPOCH", polled
# for 10 s (journald writes asynchronously). Fails when there is none.
journal_fields() {
  local try out
  for ((try = 0; try < 50; try++)); do
    out=$(journalctl -o json --no-pager "$@" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r.get("_SYSTEMD_UNIT", "-"), r.get("BLKFENCE_RESOURCE", "-"), r.get("BLKFENCE_KEY", "-"),
          r.get("BLKFENCE_EPOCH", "-"))
    break') && [[ -n $out ]] && { printf '%s\n' "$out"; return 0; }
    sleep 0.2
  done
  echo "journal_fields: no record matches $*" >&2
  return 1
}

# journal_unit_resource MATCH...: "UNIT RESOURCE" of the first journal record matching.
journal_unit_resource() {
  local record
  record=$(journal_fields "$@") || return 1
  cut -d' ' -f1,2 <<<"$record"
}

# journal_lines CURSOR UNIT TEXT: UNIT's records after CURSOR that hold TEXT ("" when none). Fails
# when the journal cannot be read: an unread journal is not one without the record.
journal_lines() {
  local records
  records=$(journal_since "$1" "$2") || return 1
  grep -F -- "$3" <<<"$records" || true
}

# journal_count UNIT TEXT: how many of UNIT's records hold TEXT; fails when the journal cannot be read.
journal_count() {
  local records
  records=$(journal_since "" "$1") || return 1
  grep -cF -- "$2" <<<"$records" || true
}

# journal_await_count UNIT TEXT N: waits (10 s) until N of UNIT's records hold TEXT.
journal_await_count() {
  local until=$((SECONDS + 10)) got=""
  while ((SECONDS < until)); do
    got=$(journal_count "$1" "$2") && ((got >= $3)) && return 0
    sleep 0.2
  done
  echo "journal_await_count: $got of $1's records hold '$2', not $3"
  return 1
}

# journal_has UNIT TEXT: UNIT's journal holds TEXT (polled for 10 s).
journal_has() { journal_await "" "$1" "$2"; }

# bf_until SECONDS COMMAND...: waits until COMMAND succeeds, for SECONDS at most.
bf_until() {
  local until=$((SECONDS + $1))
  shift
  while ((SECONDS < until)); do
    "$@" 2>/dev/null && return 0
    sleep 0.2
  done
  echo "bf_until: '$*' did not succeed within the time"
  return 1
}

# a_state_is STATE: A's resource db is in STATE.
a_state_is() { [[ $(a_field db state) == "$1" ]]; }

# lu_idle H:C:T:L: the SCSI device has no command outstanding (sysfs device_busy).
lu_idle() { [[ $(cat "/sys/class/scsi_device/$1/device/device_busy") == 0 ]]; }

# pr_generation DEV: the LU's PR generation (SPC-4: every PR OUT that changes the registrations or
# the reservation increments it), from READ KEYS. Fails when it cannot be read.
pr_generation() {
  local out
  out=$(lab_pr -k "$1") && [[ $out =~ generation=(0x[0-9a-fA-F]+) ]] ||
    { echo "pr_generation: READ KEYS on $1 failed: $out" >&2; return 1; }
  echo "${BASH_REMATCH[1]}"
}

# The gate is checked by exit status (systemd/README.md): 0 open, 1 closed.
gate_a() { a_ctl gate check db >/dev/null 2>&1; echo $?; }

# writer_start: `systemctl start lab-writer`, which must return 0 whether or not the gate lets it run.
writer_start() { systemctl start lab-writer.service; }

# expect_writer_skipped WHEN: `systemctl start lab-writer` returns 0, the writer does not run, and
# systemd says ExecCondition skipped it.
expect_writer_skipped() {
  local cursor
  cursor=$(journal_cursor)
  lab_expect "systemctl start lab-writer returns 0 $1" writer_start
  lab_expect_read "the writer does not run $1" "ActiveState=inactive MainPID=0" sd_props lab-writer ActiveState MainPID
  lab_expect "systemd skipped it: ExecCondition (gate check) failed" \
    journal_await "$cursor" lab-writer "Skipped due to 'exec-condition'"
}

lab_log "installed: $(sd_prop blkfenced FragmentPath), blkfencectl $ctl"
lab_expect "bf_clear: the LUs start without keys" bf_clear "${lus[@]}"

# --- 1. the installed files -----------------------------------------------------------------------
case $(sd_prop blkfenced FragmentPath) in
  /usr/local/lib/systemd/system/blkfenced.service | /lib/systemd/system/blkfenced.service | \
    /usr/lib/systemd/system/blkfenced.service)
    lab_ok "systemd loads the installed blkfenced.service" ;;
  *) lab_not_ok "systemd loads blkfenced.service from '$(sd_prop blkfenced FragmentPath)'" ;;
esac
lab_expect_eq "the unit runs the installed blkfenced" \
  "$(sd_prop blkfenced ExecStart | grep -o 'path=[^ ;]*')" "path=$sbin/blkfenced"
for node in A B; do
  for lu in "${lus[@]}"; do
    wwn=$(lab_dev "$node" "$lu" wwn) && hctl=$(lab_dev "$node" "$lu" hctl) || { lab_not_ok "LU $lu not in the map"; continue; }
    link=/dev/blkfence/wwn/$wwn/$hctl
    lab_expect_eq "udev names $node/$lu's sg node $link.sg" "$(readlink -f "$link.sg")" "$(lab_dev "$node" "$lu" sg)"
    lab_expect_eq "udev names $node/$lu's sd node $link.sd" "$(readlink -f "$link.sd")" "$(lab_dev "$node" "$lu" sd)"
  done
done

# --- 2. READY means known -------------------------------------------------------------------------
mkdir -p /etc/blkfence /etc/systemd/system/lab-writer.service.d /run/systemd/system/blkfenced.service.d
config 1 stop-units >/etc/blkfence/blkfence.toml
config 2 none 'state_dir = "/var/lib/blkfence-b"
run_dir = "/run/blkfence-b"' >/etc/blkfence/node-b.toml
# A shorter watchdog than the unit's 10 s, so that the watchdog check costs seconds, not a minute.
printf '[Service]\nWatchdogSec=%ss\n' "$watchdog_s" >/run/systemd/system/blkfenced.service.d/lab-watchdog.conf
cat >/etc/systemd/system/lab-writer.service <<'UNIT'
[Unit]
Description=blkfence lab writer of resource db
[Service]
ExecStart=/bin/sleep infinity
UNIT
# The drop-in as systemd/README.md installs it, with the resource's name for RESOURCE.
docdir=/usr/local/share/doc/blkfence
[[ -n ${BLKFENCE_LAB_DEB:-} ]] && docdir=/usr/share/doc/blkfence
sed 's/ RESOURCE$/ db/' "$docdir/examples/blkfence-gate.conf" >/etc/systemd/system/lab-writer.service.d/blkfence-gate.conf
lab_expect "systemctl daemon-reload" systemctl daemon-reload

lab_expect "systemctl start blkfenced returns 0" systemctl start blkfenced.service
# Read once, at once: a start that returned before READY finds no socket or a state "unknown".
if lab_capture status a_ctl status --json; then
  lab_expect_read "the state of every resource is known when the start returns" "db:released" \
    python3 -c 'import json, sys; print(" ".join(r["name"] + ":" + r["state"] for r in json.loads(sys.argv[1])["resources"]))' "$status"
else
  lab_not_ok "blkfencectl status answers when the start returns: $status"
fi
lab_expect_read "blkfenced.service is active" "ActiveState=active SubState=running" \
  sd_props blkfenced ActiveState SubState
lab_expect "the unit shows the daemon's STATUS= line" test -n "$(sd_prop blkfenced StatusText)"
lab_log "StatusText: $(sd_prop blkfenced StatusText)"
status_out=$(systemctl status blkfenced --no-pager -l 2>&1)
lab_expect "systemctl status shows the STATUS= line" grep -q 'Status: "' <<<"$status_out"

# --- 3. the gate drop-in ------------------------------------------------------------------------
expect_writer_skipped "while the gate is closed"

lab_expect "A acquires db" a_ctl acquire db --timeout 30s
key_a=$(a_field db key) epoch_a=$(a_field db epoch)
lab_log "A holds with $key_a (epoch $epoch_a)"
lab_expect "systemctl start lab-writer" writer_start
lab_expect_read "the writer runs once A holds" "ActiveState=active SubState=running" \
  sd_props lab-writer ActiveState SubState
lab_expect "A's status names its key ('$key_a')" lab_is_key "$key_a"
lab_expect_read "the journal has A's acquire with its fields" "blkfenced.service db $key_a $epoch_a" \
  journal_fields -u blkfenced "MESSAGE_ID=$msg_acquired"
verbose=$(journalctl -u blkfenced -o verbose --no-pager)
for field in "BLKFENCE_RESOURCE=db" "BLKFENCE_KEY=$key_a" "BLKFENCE_EPOCH=$epoch_a" "MESSAGE_ID=$msg_acquired" \
  "SYSLOG_IDENTIFIER=blkfenced"; do
  lab_expect "journalctl -u blkfenced -o verbose shows $field" grep -qF -- "    $field" <<<"$verbose"
done

# --- 4. B preempts A: stop-units ------------------------------------------------------------------
lab_expect "B starts (systemd-run, Type=notify)" systemd-run --unit=blkfenced-b --property=Type=notify \
  --property=NotifyAccess=main --property=RuntimeDirectory=blkfence-b --property=StateDirectory=blkfence-b \
  "$sbin/blkfenced" --config /etc/blkfence/node-b.toml
cursor=$(journal_cursor)
lab_expect "B acquires db (preempts A)" b_ctl acquire db --timeout 30s
key_b=$(b_field db key)
lab_expect "A's blkfenced asks systemd to stop the writer (on_fenced = stop-units)" \
  journal_await "$cursor" blkfenced "systemd accepted: stop lab-writer.service"
lab_expect "the writer stops" sd_await lab-writer ActiveState inactive
lab_expect "... cleanly (SIGTERM, 'Deactivated successfully')" \
  journal_await "$cursor" lab-writer "lab-writer.service: Deactivated successfully."
lab_expect_read "... not killed" "" journal_lines "$cursor" lab-writer "code=killed"
lab_expect_read "A is fenced" fenced a_field db state
lab_expect_read "journalctl MESSAGE_ID=<fenced> finds A's fence" "blkfenced.service db" \
  journal_unit_resource "MESSAGE_ID=$msg_fenced"
expect_writer_skipped "after the fence"

# --- 5. kill-units --------------------------------------------------------------------------------
config 1 kill-units >/etc/blkfence/blkfence.toml
lab_expect "systemctl restart blkfenced (on_fenced = kill-units)" systemctl restart blkfenced.service
lab_expect_read "restarted after the fence, A does not adopt its lost key" "released" a_field db state
lab_expect_eq "A's gate is closed" "$(gate_a)" 1
lab_expect "B releases db" b_ctl release db
lab_expect "A acquires db from the released holder" a_ctl acquire db --timeout 30s
lab_expect "systemctl start lab-writer" writer_start
lab_expect_read "the writer runs" "active" sd_prop lab-writer ActiveState
cursor=$(journal_cursor)
lab_expect "B acquires db (preempts A)" b_ctl acquire db --timeout 30s
lab_expect "A's blkfenced asks systemd to kill the writer (on_fenced = kill-units)" \
  journal_await "$cursor" blkfenced "systemd accepted: send SIGKILL to every process of lab-writer.service"
lab_expect "the writer fails" sd_await lab-writer ActiveState failed
lab_expect_read "... killed by SIGKILL" "Result=signal ExecMainCode=2 ExecMainStatus=9" \
  sd_props lab-writer Result ExecMainCode ExecMainStatus

# --- 6. the watchdog ------------------------------------------------------------------------------
lab_expect "B releases db" b_ctl release db
lab_expect "A acquires db" a_ctl acquire db --timeout 30s
key_a=$(a_field db key) epoch_a=$(a_field db epoch)
systemctl reset-failed lab-writer.service
lab_expect "systemctl start lab-writer" writer_start
lab_expect_read "the writer runs" "active" sd_prop lab-writer ActiveState
restarts=$(sd_prop blkfenced NRestarts) pid=$(sd_prop blkfenced MainPID)
lab_log "freezing A's blkfenced (pid $pid, $restarts restarts so far, WatchdogSec=${watchdog_s}s)"
cursor=$(journal_cursor) timeouts=$(journal_count blkfenced "Watchdog timeout (limit ${watchdog_s}s)!")
kill -STOP "$pid"
lab_expect "systemd restarts the frozen daemon (NRestarts grows)" sd_await blkfenced NRestarts $((restarts + 1))
lab_expect "... and it is active again" sd_await blkfenced ActiveState active
lab_expect "... with a new MainPID" test "$(sd_prop blkfenced MainPID)" != "$pid"
lab_expect "systemd logged the watchdog timeout" \
  journal_await_count blkfenced "Watchdog timeout (limit ${watchdog_s}s)!" $((timeouts + 1))
lab_expect "... and ended the daemon with SIGABRT" journal_await "$cursor" blkfenced "code=killed, status=6/ABRT"
lab_expect "the writer, bound to blkfenced, was stopped with it" journal_await "$cursor" lab-writer "Stopping lab-writer.service"
lab_expect_key "restarted while holding, A adopts its key" "$key_a" a_field db key
lab_expect_read "... with the same epoch" "$epoch_a" a_field db epoch
lab_expect_read "... and holds" "held" a_field db state
lab_expect_eq "A's gate is open" "$(gate_a)" 0
lab_expect_read "the writer stays stopped until started again" "ActiveState=inactive MainPID=0" \
  sd_props lab-writer ActiveState MainPID
lab_expect "systemctl start lab-writer" writer_start
lab_expect_read "the writer runs again behind the adopted key" "active" sd_prop lab-writer ActiveState

restarts=$(sd_prop blkfenced NRestarts) pid=$(sd_prop blkfenced MainPID)
lab_log "freezing A's blkfenced (pid $pid) while B preempts it"
cursor=$(journal_cursor)
kill -STOP "$pid"
lab_expect "B acquires db while A is frozen" b_ctl acquire db --timeout 30s
lab_expect "systemd restarts the frozen daemon" sd_await blkfenced NRestarts $((restarts + 1))
lab_expect "... and it is active again" sd_await blkfenced ActiveState active
lab_expect "the writer was stopped with it" journal_await "$cursor" lab-writer "Stopping lab-writer.service"
lab_expect_read "restarted after B preempted it, A does not adopt its key" "released" a_field db state
lab_expect_eq "A's gate is closed" "$(gate_a)" 1
expect_writer_skipped "after the restart, with the gate closed"

# --- 7. reload, SIGHUP, stop ----------------------------------------------------------------------
restarts=$(sd_prop blkfenced NRestarts) pid=$(sd_prop blkfenced MainPID)
lab_expect "systemctl reload is refused: the unit has no ExecReload= (nothing is reloaded)" \
  bash -c '! systemctl reload blkfenced.service'
lab_expect "systemctl kill -s HUP blkfenced" systemctl kill --kill-who=main -s HUP blkfenced.service
lab_expect "SIGHUP is logged and ignored" journal_has blkfenced "SIGHUP ignored"
lab_expect_read "... the daemon runs on (same MainPID, no restart)" "MainPID=$pid NRestarts=$restarts ActiveState=active" \
  sd_props blkfenced MainPID NRestarts ActiveState

# An acquire held up: node A's SCSI host put in recovery holds its commands in the host's queue
# (the midlayer dispatches nothing to a host in recovery, and a command not dispatched has no
# timeout running), so A's acquire waits on its first read for command_timeout (20 s here).
sed -i 's/^lease = .*/lease = "30s"/; s/^command_timeout = .*/command_timeout = "20s"/' /etc/blkfence/blkfence.toml
lab_expect "systemctl restart blkfenced (command_timeout 20s)" systemctl restart blkfenced.service
b_sg=$(lab_dev B 0 sg) a_hctl=$(lab_dev A 0 hctl) key_b=$(b_field db key)
a_host=/sys/class/scsi_host/host${a_hctl%%:*}
lab_capture generation pr_generation "$b_sg" || lab_not_ok "the PR generation of LU 0 cannot be read: $generation"
lab_expect "A's SCSI host goes into recovery" eval "echo recovery >$a_host/state"
a_ctl acquire db --timeout 60s >/tmp/held-acquire.out 2>&1 &
held_acquire=$!
lab_expect "A's acquire is held up" bf_until 10 a_state_is acquiring
restarts=$(sd_prop blkfenced NRestarts) stop_start=$SECONDS
lab_expect "systemctl stop blkfenced while the acquire runs" systemctl stop blkfenced.service
wait "$held_acquire"
lab_log "the stop took $((SECONDS - stop_start)) s; the acquire exited $?: $(tr '\n' ' ' </tmp/held-acquire.out)"
lab_expect "A's SCSI host runs again" eval "echo running >$a_host/state"
lab_expect "A's held commands are done" bf_until 30 lu_idle "$a_hctl"
lab_expect_read "no PR OUT reached the LU: its PR generation is unchanged" "$generation" pr_generation "$b_sg"
lab_expect "B's status names its key ('$key_b')" lab_is_key "$key_b"
lab_expect_read "... and B's key is the only key on LU 0" "$key_b " lab_keyset "$b_sg"
lab_expect_read "the daemon stopped cleanly (not killed, not restarted)" \
  "ActiveState=inactive Result=success NRestarts=$restarts" sd_props blkfenced ActiveState Result NRestarts
lab_expect "systemd removed /run/blkfence (no token without a daemon)" test ! -e /run/blkfence
lab_expect "the epoch file stays in /var/lib/blkfence" test -s /var/lib/blkfence/db.epoch
lab_log "journal of A:"
journalctl -u blkfenced -o short-monotonic --no-pager | tail -n 40
systemctl stop blkfenced-b.service
# The node as installed again for what runs next in this boot (lab.systemd: reboot.sh): the lab's
# writer unit and watchdog drop-in go; systemd forgets them at its next reload (an enable does one).
rm -rf /etc/systemd/system/lab-writer.service /etc/systemd/system/lab-writer.service.d \
  /run/systemd/system/blkfenced.service.d/lab-watchdog.conf
lab_done

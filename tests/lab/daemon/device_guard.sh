#!/bin/bash
# `blkfencectl device` refuses to act behind a local blkfenced (issue 12; docs/blkfencectl.md, "LUs
# that blkfenced manages"), on real LIO: node A's daemon holds resource db on the LUs, and on A's
# own devices (sd and sg names, so the match is by WWN, not by name):
#   1. `device clear` with A's socket in $BLKFENCE_SOCKET exits 10, names the resource, the
#      socket, each LU's WWN and --force, and sends nothing: A's key is still the only key and the
#      holder of every LU, and the PR generation (read through B's nexus) did not move;
#   2. every other PR OUT action (register, unregister, reserve, release, preempt), with the
#      socket given by --socket, is refused the same way, and the LUs are unchanged;
#   3. the PR IN actions do not ask: `device keys` runs and lists A's key;
#   4. A's daemon stopped (SIGSTOP, its socket open and silent): `device clear` is refused after
#      the 2 s bound, saying so (fail closed), and the LUs are unchanged;
#   5. `--force` sends: a REGISTER AND IGNORE EXISTING KEY of A's own key on A's paths (which changes
#      no key, so A goes on holding) exits 0 and moves the PR generation; A's daemon still holds,
#      its gate open, after more monitor rounds;
#   6. A's daemon stopped for good: `device clear` goes ahead (no one listens on the socket) and
#      leaves the LUs without keys.
# No PREEMPT AND ABORT anywhere: were the guard broken, one would reach LIO over tcm_loop, which
# deadlocks on it (tests/lab/README.md).
#   usage: device_guard.sh DB_LUS      e.g. device_guard.sh 10,11
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
db_lus=${1//,/ }
first_lu=${db_lus%% *}
b_dev=$(lab_dev B "$first_lu")
socket=$BF/A/run/control.sock

# generation DEV: the PR generation (0x...), read through DEV's nexus. Fails when it cannot be read.
generation() {
  local out
  out=$(lab_pr -k "$1") || { echo "generation: sg_persist -k $1 failed (exit $?)" >&2; return 1; }
  awk -v dev="$1" '
    match($0, /PR generation=0x[0-9a-fA-F]+/) { print substr($0, RSTART + 14, RLENGTH - 14); found = 1; exit }
    END { if (!found) { printf "generation: no PR generation in the answer from %s\n", dev > "/dev/stderr"; exit 1 } }' <<<"$out"
}

# A's devices: the first LU by its sd node, the others by their sg nodes.
a_devs=() wwns=()
for lu in $db_lus; do
  if [[ $lu == "$first_lu" ]]; then a_devs+=("$(lab_dev A "$lu")"); else a_devs+=("$(lab_dev A "$lu" sg)"); fi
  wwns+=("$(lab_dev A "$lu" wwn)")
done

rm -rf "$BF"
lab_expect "the LUs are cleared first" bf_clear $db_lus
# A long lease: step 4 stops the daemon for the guard's 2 s bound, which must not cost it contact.
bf_config A 1 preempt "$db_lus" "" 500ms 10s
lab_expect "A's daemon starts" bf_start A
lab_expect "A acquires db" bf_ctl A acquire db --timeout 30s
key_a=$(bf_field A db key)
lab_log "A holds db with $key_a on ${a_devs[*]} (${wwns[*]})"
lab_expect_read "A's key is the only key on every LU (read by B)" "$key_a " bf_keys_everywhere $db_lus
gen0="" gen1=""
lab_capture gen0 generation "$b_dev" || lab_not_ok "the PR generation of LU $first_lu: $gen0"

# --- 1. clear is refused -------------------------------------------------------------------------
out=$(BLKFENCE_SOCKET=$socket "$BLKFENCECTL" device clear --key "$key_a" "${a_devs[@]}" 2>&1)
rc=$?
lab_expect_eq "device clear while A's daemon holds the LUs exits 10" "$rc" 10
lab_log "the refusal: $out"
lab_expect "... names resource db" grep -qF "resource db, state held" <<<"$out"
lab_expect "... names the daemon's socket" grep -qF "socket $socket" <<<"$out"
for i in "${!wwns[@]}"; do
  lab_expect "... names ${a_devs[i]} and its WWN" grep -qF "${a_devs[i]} (wwn ${wwns[i]})" <<<"$out"
done
lab_expect "... says how to override (--force)" grep -qF -- "--force" <<<"$out"
lab_expect_read "A's key is still the only key on every LU" "$key_a " bf_keys_everywhere $db_lus
lab_expect_read "A's key still holds every LU" "$key_a " bf_holders_everywhere $db_lus
lab_expect_read "the PR generation did not move" "$gen0" generation "$b_dev"

# --- 2. every other PR OUT is refused ------------------------------------------------------------
for action in "register --key 0x1234" unregister "reserve --key $key_a" "release --key $key_a" \
  "preempt --key $key_a --victim $key_a"; do
  # shellcheck disable=SC2086 # the action and its options are words
  env -u BLKFENCE_SOCKET "$BLKFENCECTL" device $action --socket "$socket" "${a_devs[@]}" >/dev/null 2>&1
  rc=$?
  lab_expect_eq "device ${action%% *} (--socket) is refused with 10" "$rc" 10
done
lab_expect_read "A's key is still the only key on every LU" "$key_a " bf_keys_everywhere $db_lus
lab_expect_read "A's key still holds every LU" "$key_a " bf_holders_everywhere $db_lus
lab_expect_read "the PR generation did not move" "$gen0" generation "$b_dev"

# --- 3. reads do not ask -------------------------------------------------------------------------
out=$(BLKFENCE_SOCKET=$socket "$BLKFENCECTL" device keys "${a_devs[@]}" 2>&1)
rc=$?
lab_expect_eq "device keys runs while A's daemon holds the LUs" "$rc" 0
lab_expect "... and lists A's key" grep -qF "$key_a" <<<"$out"

# --- 4. a daemon that does not answer: fail closed -----------------------------------------------
a_pid=$(cat "$BF/A/pid")
kill -STOP "$a_pid"
out=$(BLKFENCE_SOCKET=$socket "$BLKFENCECTL" device clear --key "$key_a" "${a_devs[@]}" 2>&1)
rc=$?
kill -CONT "$a_pid"
lab_expect_eq "device clear while A's daemon is stopped exits 10" "$rc" 10
lab_expect "... saying it did not answer" grep -qF "socket $socket) did not answer within 2000 ms" <<<"$out"
lab_expect_read "A's key is still the only key on every LU" "$key_a " bf_keys_everywhere $db_lus
lab_expect_read "the PR generation did not move" "$gen0" generation "$b_dev"

# --- 5. --force sends ----------------------------------------------------------------------------
out=$(BLKFENCE_SOCKET=$socket "$BLKFENCECTL" device register --force --key "$key_a" "${a_devs[@]}" 2>&1)
rc=$?
lab_expect_eq "device register --force of A's own key exits 0 (${out//$'\n'/; })" "$rc" 0
if lab_capture gen1 generation "$b_dev"; then
  lab_expect "the PR generation moved ($gen0 -> $gen1): the REGISTER went out" test "$(printf %d "$gen1")" -gt "$(printf %d "$gen0")"
else
  lab_not_ok "the PR generation after --force: $gen1"
fi
lab_expect_read "A's key is still the only key on every LU" "$key_a " bf_keys_everywhere $db_lus
lab_expect "A's daemon finishes 3 more monitor rounds" bf_await_checks A db 3
lab_expect_eq "A still holds db with its gate open" "$(bf_field A db state)/$(bf_field A db gate_open)" held/true

# --- 6. no daemon: go ahead ----------------------------------------------------------------------
bf_stop A
out=$(BLKFENCE_SOCKET=$socket "$BLKFENCECTL" device clear --key "$key_a" "${a_devs[@]}" 2>&1)
rc=$?
lab_expect_eq "with A's daemon stopped, device clear runs and exits 0 (${out//$'\n'/; })" "$rc" 0
lab_expect_read "the LUs have no keys left" "" bf_keys_everywhere $db_lus
lab_expect "the LUs are cleared" bf_clear $db_lus
lab_done

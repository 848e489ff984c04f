#!/bin/bash
# Two nodes configured with one node_id (docs/protocol.md, "Identical keys"), on real LIO over
# iSCSI, where each node's initiator port is its own iSCSI name: node A's daemon holds resource db
# on the LU; node B's daemon, configured with A's node_id 1 as well:
#   1. starts undecided: its status stays unknown and says that A's key is registered through A's
#      initiator port, which is none of B's; it neither adopts A's key nor takes it for its own;
#   2. its acquire is refused with the conflict status (4) and the same reason, and sends nothing:
#      A's key is still the only key and the holder of the LU, the PR generation did not move, and
#      A's gate is still open;
#   3. A's own registrations, made under its sessions' ISIDs, are its own: A's daemon started
#      again adopts its key and opens its gate;
#   4. the control, that the refusal came from the identical ids: B configured with node_id 2
#      acquires, and A's daemon reports itself fenced.
#   usage: identical_keys.sh LU
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
lu=$1
b_dev=$(lab_dev B "$lu")
a_port=iqn.2026-11.org.blkfence.lab:node-a  # tests/lab/guest/topology.sh names A's initiator so

# generation: the PR generation (0x...) of the LU, read through B's nexus.
generation() {
  local out
  out=$(lab_pr -k "$b_dev") || { echo "generation: sg_persist -k $b_dev failed (exit $?)" >&2; return 1; }
  awk 'match($0, /PR generation=0x[0-9a-fA-F]+/) { print substr($0, RSTART + 14, RLENGTH - 14); found = 1; exit }
    END { if (!found) { print "generation: no PR generation in the answer" > "/dev/stderr"; exit 1 } }' <<<"$out"
}

# b_undecided: waits until B's status for db is unknown and names A's key and initiator port.
b_undecided() {
  local try state detail=""
  for ((try = 0; try < 150; try++)); do
    state=$(bf_field B db state 2>/dev/null) && detail=$(bf_field B db detail 2>/dev/null) &&
      [[ $state == unknown && $detail == *"key $key_a of this node"*"through initiator port $a_port,"* ]] &&
      return 0
    sleep 0.1
  done
  echo "B's db is '${state:-?}': $detail"
  return 1
}

rm -rf "$BF"
lab_expect "the LU is cleared first" bf_clear "$lu"
bf_config A 1 preempt-and-abort "$lu" ""
bf_config B 1 preempt-and-abort "$lu" ""
lab_expect "A's daemon starts" bf_start A
lab_expect "A acquires db" bf_ctl A acquire db --timeout 30s
key_a=$(bf_field A db key)
lab_expect_read "A's key is the only key on the LU" "$key_a " bf_keys_everywhere "$lu"
gen0=""
lab_capture gen0 generation || lab_not_ok "the PR generation: $gen0"

# --- 1. B, with A's node_id, starts undecided ---------------------------------------------------
"$BLKFENCED" --config "$BF/B/blkfence.toml" --log stderr >>"$BF/B/log" 2>&1 &
echo $! >"$BF/B/pid"
lab_expect "B's daemon (node_id 1 too) stays undecided, naming A's key and A's initiator port" b_undecided
lab_log "B's status: $(bf_field B db detail)"
lab_expect_read "B's gate is closed" false bf_field B db gate_open

# --- 2. B's acquire is refused, and sends nothing ------------------------------------------------
out=$(bf_ctl B acquire db --timeout 30s 2>&1)
rc=$?
lab_expect_eq "B's acquire is refused with the conflict status" "$rc" 4
lab_log "the refusal: $out"
lab_expect "... naming A's initiator port" grep -qF "through initiator port $a_port," <<<"$out"
lab_expect_read "A's key is still the only key on the LU" "$key_a " bf_keys_everywhere "$lu"
lab_expect_read "A's key still holds the LU" "$key_a " bf_holders_everywhere "$lu"
lab_expect_read "the PR generation did not move" "$gen0" generation
lab_expect_read "A's gate is still open" true bf_field A db gate_open
lab_expect "A's daemon completes more monitor rounds, still holding" bf_await_checks A db 3
lab_expect_read "A still holds db" held bf_field A db state
bf_stop B

# --- 3. A's own registrations are its own: its daemon started again adopts its key --------------
bf_stop A
lab_expect "A's daemon starts again and decides (its registrations, under its sessions' ISIDs, are its own)" bf_start A
lab_expect_read "A holds db again" held bf_field A db state
lab_expect_read "... with the same key" "$key_a" bf_field A db key
lab_expect_read "... its gate open" true bf_field A db gate_open

# --- 4. the control: B with its own node_id takes the LU ---------------------------------------
bf_config B 2 preempt-and-abort "$lu" ""
lab_expect "B's daemon (node_id 2) starts" bf_start B
lab_expect "B acquires db" bf_ctl B acquire db --timeout 30s
key_b=$(bf_field B db key)
lab_expect_read "B's key is the only key on the LU" "$key_b " bf_keys_everywhere "$lu"
lab_expect "A's daemon reports itself fenced" bf_await A db state fenced
bf_stop A
bf_stop B
lab_expect "the LU is cleared" bf_clear "$lu"
lab_done

#!/bin/bash
# Patroni switchover on real LIO LUs, and the automatic rejoin of the demoted old primary
# (integrations/patroni/blkfence-patroni-rejoin): a two-member cluster (tests/lab/patroni/lib.sh),
# a client writing through a multi-host read-write conninfo and recording each id only after COMMIT
# returned, then `patronictl switchover --leader pg-a --candidate pg-b --force`. A demotes cleanly,
# B's pre_promote preempts A's key (the holder's), which fences A: its daemon's on_fenced runs
# member.sh rejoin A, the lab's stand-in for blkfence-patroni-rejoin@pg.service. The check never
# runs a rejoin step itself; it proves that A came back by itself:
#   B is the primary and holds both LUs; A's daemon reported the fence and ran its on_fenced
#   command to a successful end; A's key is registered on both LUs again; A streams from B and a
#   row written on B reaches it; the client carried on and every id it recorded is on B.
# Measured: switchover -> B primary, A fenced -> A streaming from B again.
#   unwired: the same with on_fenced = "none" on A. A must stay fenced and not come back: the
#            checks above that prove the rejoin fail (A's Patroni on its broken file system may
#            take the whole 3 s curl timeout to answer, and the guest crawls while it retries, so
#            /replica is asked 30 times, not 900, and B about A's stream 25 times).
#            Not in CI; it shows that the check can fail.
# Run it with
#   tests/lab/run --fabric tcm_loop --nodes 2 --luns 2 --lun-size-mb 256 --deadline 900 \
#     --env BLKFENCECTL=... --env BLKFENCED=... -- tests/lab/guest/suite patroni/switchover
#   usage: switchover.sh [unwired]
# shellcheck disable=SC2016 # the eval'd checks expand their variables when they run
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/patroni/lib.sh"
wiring=${1:-wired}
[[ $wiring == wired || $wiring == unwired ]] || { echo "usage: switchover.sh [unwired]"; exit 2; }
PGL_RUN=switchover-$wiring
trap 'pgl_teardown; bf_save_logs' EXIT

declare -A node_id=([A]=1 [B]=2)
cluster_prefix=""  # the first 16 bits of every key: the hash of the daemons' cluster name
pgl_hook_env A B
# holder_node: the node id (middle 16 bits) of the one key holding both LUs, read through B.
holder_node() {
  local holders
  holders=$(bf_holders_everywhere 0 1) || return 1
  [[ $holders =~ ^0x${cluster_prefix}([0-9a-f]{4})[0-9a-f]{8}\ $ ]] ||
    { echo "holder_node: not one key of this cluster on both LUs: '$holders'" >&2; return 1; }
  echo $((16#${BASH_REMATCH[1]}))
}
# await_line PATTERN FILE TRIES: waits (0.2 s steps) until a line of FILE matches PATTERN.
await_line() {
  local try
  for ((try = 0; try < $3; try++)); do
    (($(pgl_count "$1" "$2") >= 1)) && return 0
    sleep 0.2
  done
  echo "await_line: no line matching '$1' in $2"
  return 1
}
# await_sql NODE SQL WANT TRIES: waits (0.2 s steps) until SQL on NODE answers WANT.
await_sql() {
  local try
  for ((try = 0; try < $4; try++)); do
    [[ $(pgl_psql "$1" "$2" 2>/dev/null) == "$3" ]] && return 0
    sleep 0.2
  done
  return 1
}
lab_log "on_fenced $wiring"

# --- the cluster ---------------------------------------------------------------------------------
pgl_teardown
mkdir -p "$PGL"
lab_expect "the LUs are cleared" bf_clear 0 1
lab_expect "ext4 on A's LU 0 (A's nexus) and B's LU 1 (B's nexus), each in /etc/fstab" \
  eval 'pgl_fs A && pgl_fs B && pgl_fstab A && pgl_fstab B'
for node in A B; do
  on_fenced="[\"$BLKFENCE_LAB_REPO/tests/lab/patroni/member.sh\", \"rejoin\", \"$node\"]"
  [[ $wiring == unwired && $node == A ]] && on_fenced='"none"'
  pgl_bf_config "$node" "${node_id[$node]}" "$on_fenced"
  lab_expect "$node's blkfenced starts (on_fenced = $on_fenced)" bf_start "$node"
done
for node in A B; do
  lab_expect "$node registers its member key on both LUs" bf_ctl "$node" unfence pg
done
lab_capture keys bf_keys_everywhere 0 1
[[ $keys =~ ^0x([0-9a-f]{4})0001[0-9a-f]{8}\ 0x([0-9a-f]{4})0002[0-9a-f]{8}\ $ ]] &&
  [[ ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]] && cluster_prefix=${BASH_REMATCH[1]}
lab_expect "A's and B's member keys, one each, on both LUs ($keys)" test -n "$cluster_prefix"
lab_expect "etcd answers" pgl_etcd_start
lab_expect "A's and B's patroni.yml from integrations/patroni/patroni.yml.in" \
  eval 'pgl_config A && pgl_config B'
lab_require "the hooks and blkfencectl installed for postgres (pgl_install)" pgl_install
lab_require "postgres reaches all that A's and B's Patroni need" pgl_check_access_all A B
t0=$EPOCHREALTIME
pgl_patroni_start A
lab_require "A bootstraps the cluster and runs as primary" pgl_await A /primary 900
lab_log "A bootstrapped: $(pgl_ms_since "$t0") ms"
lab_expect_read "post_bootstrap made A the holder of both LUs" "${node_id[A]}" holder_node
t0=$EPOCHREALTIME
pgl_patroni_start B
lab_require "B clones A and runs as a replica" pgl_await B /replica 900
lab_log "B replica: $(pgl_ms_since "$t0") ms"
lab_expect "the table is created on A" pgl_psql A "CREATE TABLE t (id bigint PRIMARY KEY, note text)"
await_sql A "SELECT sync_state FROM pg_stat_replication" sync 150
lab_expect_read "B is A's synchronous standby" sync pgl_psql A "SELECT sync_state FROM pg_stat_replication"

# --- the client ----------------------------------------------------------------------------------
/usr/bin/python3 "$BLKFENCE_LAB_REPO/tests/lab/patroni/client.py" writer "$PGL_CONNINFO" "$PGL/client.log" "$PGL/client.stop" &
echo $! >"$PGL/client.pid"
for ((try = 0; try < 300; try++)); do
  (($(pgl_count '^ok ' "$PGL/client.log") >= 5)) && break
  sleep 0.2
done
lab_expect "the client commits through A" test "$(pgl_count '^ok ' "$PGL/client.log")" -ge 5

# --- the switchover ------------------------------------------------------------------------------
t_switch=$EPOCHREALTIME
lab_expect "patronictl switchover --leader pg-a --candidate pg-b --force" eval \
  'patronictl -c "$PGL/a.yml" switchover --leader pg-a --candidate pg-b --force >"$PGL/switchover.log" 2>&1'
lab_expect "B promotes" pgl_await_promoted B 600
lab_log "B primary $(pgl_ms_since "$t_switch") ms after the switchover began"
lab_expect "patronictl reports the switchover done" grep -q 'Successfully switched over to "pg-b"' "$PGL/switchover.log"
lab_expect_read "B's pre_promote made B the holder of both LUs" "${node_id[B]}" holder_node
ok_before=$(pgl_count '^ok ' "$PGL/client.log")
for ((try = 0; try < 300; try++)); do
  (($(pgl_count '^ok ' "$PGL/client.log") >= ok_before + 5)) && break
  sleep 0.2
done
lab_expect "the client carries on against B" test "$(pgl_count '^ok ' "$PGL/client.log")" -ge $((ok_before + 5))

# --- A: fenced by B's promote, back by itself -----------------------------------------------------
fenced_id=5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a13  # docs/operations.md: "fenced: another key holds a LU"
lab_expect "A's blkfenced reports A fenced" await_line "message_id=$fenced_id" "$BF/A/log" 150
t_fenced=$(sed -n "/message_id=$fenced_id/{s/^<[0-9]>\\[\\([0-9.]*\\)\\].*/\\1/p;q}" "$BF/A/log")
replica_tries=900 stream_tries=900
[[ $wiring == unwired ]] && replica_tries=30 stream_tries=25
if [[ $wiring == wired ]]; then
  lab_expect "A's on_fenced command (member.sh rejoin A) ran" \
    await_line 'on_fenced command .*/member.sh \(finished\|failed\)' "$BF/A/log" 1500
  lab_expect "... and ended with exit 0" grep -q 'on_fenced command .*/member.sh finished' "$BF/A/log"
  lab_expect "blkfence-patroni-rejoin says A rejoined" grep -q 'blkfence-patroni-rejoin: .* rejoined in' "$PGL/rejoin-a.log"
fi
lab_expect "A runs as a replica again" pgl_await A /replica "$replica_tries"
if await_sql B "SELECT state FROM pg_stat_replication WHERE application_name = 'pg-a'" streaming "$stream_tries"; then
  lab_log "A streaming from B $(pgl_ms_since "${t_fenced:-$EPOCHREALTIME}") ms after A's daemon saw the fence"
fi
lab_expect_read "B streams to A" streaming pgl_psql B "SELECT state FROM pg_stat_replication WHERE application_name = 'pg-a'"
lab_expect_read "A's blkfenced: A is a member again" unfenced bf_field A pg state
lab_capture keys bf_keys_everywhere 0 1
lab_expect "A's key is registered on both LUs again ($keys)" eval '[[ $keys == *"0x${cluster_prefix}0001"* ]]'
lab_expect_read "B still holds both LUs" "${node_id[B]}" holder_node
lab_expect "a row written on B" pgl_psql B "INSERT INTO t (id, note) VALUES (-2, 'after the switchover')"
await_sql A "SELECT count(*) FROM t WHERE id = -2" 1 150
lab_expect_read "reaches A" 1 pgl_psql A "SELECT count(*) FROM t WHERE id = -2"

# --- no acknowledged commit lost -----------------------------------------------------------------
touch "$PGL/client.stop"
wait "$(cat "$PGL/client.pid")"
acked=$(awk '$1 == "ok" { print $2 }' "$PGL/client.log" | sort -n)
lab_capture on_b pgl_psql B "SELECT id FROM t WHERE id > 0 ORDER BY id"
# shellcheck disable=SC2154 # on_b is set by lab_capture
missing=$(comm -23 <(sort <<<"$acked") <(sort <<<"$on_b") | tr '\n' ' ')
lab_log "client: $(wc -l <<<"$acked") commits acknowledged, $(pgl_count '^fail ' "$PGL/client.log") failed or timed out"
lab_expect_eq "every id the client recorded is on B" "$missing" ""
lab_expect "the client recorded ids at all" test -n "$acked"
lab_done

#!/bin/bash
# Patroni failover on real LIO LUs, with and without the fence (issue 11; integrations/patroni):
# a two-member cluster (tests/lab/patroni/lib.sh), a client writing through a multi-host
# read-write conninfo and recording each id only after COMMIT returned, and a session opened on
# the primary beforehand with synchronous_commit = local. The primary's Patroni and postmaster
# process group are frozen (SIGSTOP); the replica takes the leader lock, runs pre_promote and
# promotes; the client carries on. Then the old postmaster alone is resumed and the stale session
# commits a row carrying a marker.
#   fence:   pre_promote is blkfence's hook. First B's path to LU 0 is taken offline during the
#            freeze: B wins the leader lock, its pre_promote cannot fence and fails, and B must
#            stay in recovery on its timeline; once the path is back, B promotes by itself. The
#            stale commit must not be acknowledged, the marker must be on no LU (the LUs' backing
#            files, read below the target), and the kernel logs a reservation conflict on node A's
#            nexus to its LU.
#   control: pre_promote is /bin/true. The stale commit IS acknowledged and its marker IS on A's
#            LU: the harness sees what the fence prevents.
# Both: the replica promotes; every id the client recorded is on the final primary.
# With "rejoin" (fence only), the old primary then comes back as a replica by the documented
# procedure (integrations/patroni/README.md) and B's writes reach it. Under TCG that costs about
# three minutes more (crash recovery, pg_rewind), so lab.patroni leaves it out; run it with
#   tests/lab/run --fabric tcm_loop --nodes 2 --luns 2 --lun-size-mb 256 --deadline 900 \
#     --env BLKFENCECTL=... --env BLKFENCED=... -- tests/lab/guest/suite patroni/failover:fence:rejoin
#   usage: failover.sh fence|control [rejoin]
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/patroni/lib.sh"
mode=${1:?usage: failover.sh fence|control [rejoin]} rejoin=${2:-}
[[ $mode == fence || $mode == control ]] || { echo "failover.sh: unknown mode '$mode'"; exit 2; }
[[ -z $rejoin || ($rejoin == rejoin && $mode == fence) ]] || { echo "failover.sh: 'rejoin' goes with fence only"; exit 2; }
PGL_RUN=$mode
trap 'pgl_teardown; bf_save_logs' EXIT

declare -A node_id=([A]=1 [B]=2)
cluster_prefix=""  # the first 16 bits of every key: the hash of the daemons' cluster name
pgl_hook_env A B
# member NODE ARGS...: blkfencectl against NODE's daemon, as NODE's hook runs it.
member() { bf_ctl "$@"; }
# holder_node: the node id (middle 16 bits) of the one key holding both LUs, read through B.
holder_node() {
  local holders
  holders=$(bf_holders_everywhere 0 1) || return 1
  [[ $holders =~ ^0x${cluster_prefix}([0-9a-f]{4})[0-9a-f]{8}\ $ ]] ||
    { echo "holder_node: not one key of this cluster on both LUs: '$holders'" >&2; return 1; }
  echo $((16#${BASH_REMATCH[1]}))
}
lab_log "mode $mode"

# --- the cluster ---------------------------------------------------------------------------------
pgl_teardown
mkdir -p "$PGL"
lab_expect "the LUs are cleared" bf_clear 0 1
t0=$EPOCHREALTIME
lab_expect "ext4 on A's LU 0 (A's nexus) and B's LU 1 (B's nexus)" eval 'pgl_fs A && pgl_fs B'
lab_log "file systems: $(pgl_ms_since "$t0") ms"
for node in A B; do
  pgl_bf_config "$node" "${node_id[$node]}"
  lab_expect "$node's blkfenced starts" bf_start "$node"
done
for node in A B; do
  lab_expect "$node registers its member key on both LUs" member "$node" unfence pg
done
lab_capture keys bf_keys_everywhere 0 1
[[ $keys =~ ^0x([0-9a-f]{4})0001[0-9a-f]{8}\ 0x([0-9a-f]{4})0002[0-9a-f]{8}\ $ ]] &&
  [[ ${BASH_REMATCH[1]} == "${BASH_REMATCH[2]}" ]] && cluster_prefix=${BASH_REMATCH[1]}
lab_expect "A's and B's member keys, one each, on both LUs ($keys)" test -n "$cluster_prefix"
t0=$EPOCHREALTIME
lab_expect "etcd answers" pgl_etcd_start
lab_log "etcd up: $(pgl_ms_since "$t0") ms"
pre_promote=""
[[ $mode == control ]] && pre_promote=/bin/true
lab_expect "A's and B's patroni.yml from integrations/patroni/patroni.yml.in" \
  eval 'pgl_config A "$pre_promote" && pgl_config B "$pre_promote"'
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
for ((try = 0; try < 150; try++)); do
  [[ $(pgl_psql A "SELECT sync_state FROM pg_stat_replication" 2>/dev/null) == sync ]] && break
  sleep 0.2
done
lab_expect_read "B is A's synchronous standby" sync pgl_psql A "SELECT sync_state FROM pg_stat_replication"

# --- the client and the stale session ------------------------------------------------------------
/usr/bin/python3 "$BLKFENCE_LAB_REPO/tests/lab/patroni/client.py" writer "$PGL_CONNINFO" "$PGL/client.log" "$PGL/client.stop" &
echo $! >"$PGL/client.pid"
for ((try = 0; try < 300; try++)); do
  (($(pgl_count '^ok ' "$PGL/client.log") >= 5)) && break
  sleep 0.2
done
lab_expect "the client commits through A" test "$(pgl_count '^ok ' "$PGL/client.log")" -ge 5
marker=blkfence-stale-commit-$mode-$RANDOM$RANDOM
/usr/bin/python3 "$BLKFENCE_LAB_REPO/tests/lab/patroni/client.py" stale \
  "host=127.0.0.1 port=5432 user=postgres password=$PGL_PASSWORD dbname=postgres" \
  "$PGL/stale.state" "$PGL/stale.go" "$marker" &
echo $! >"$PGL/client-stale.pid"
for ((try = 0; try < 100; try++)); do [[ -s $PGL/stale.state ]] && break; sleep 0.1; done
lab_expect_read "a session on A with synchronous_commit = local is open" ready cat "$PGL/stale.state"

# --- freeze A ------------------------------------------------------------------------------------
patroni_a=$(cat "$PGL/patroni-a.pid") postmaster_a=$(pgl_postmaster_group A)
echo "$postmaster_a" >"$PGL/postmaster-a.group"
dmesg_lines=$(dmesg | wc -l)
if [[ $mode == fence ]]; then
  b_path0=/sys/class/scsi_device/$(lab_dev B 0 hctl)/device/state
  lab_capture timeline pgl_psql B "SELECT timeline_id FROM pg_control_checkpoint()"
  lab_expect "B's path to LU 0 goes offline" eval "echo offline >'$b_path0'"
fi
lab_expect "A's Patroni and postmaster group are frozen" eval 'kill -STOP "$patroni_a" && kill -STOP -- "-$postmaster_a"'
t_freeze=$EPOCHREALTIME
lab_log "froze A's Patroni ($patroni_a) and postmaster group ($postmaster_a)"
if [[ $mode == fence ]]; then
  # --- a fence that cannot be made blocks the promotion ---
  for ((try = 0; try < 600; try++)); do
    (($(pgl_count 'pre_promote script .* exited with [1-9]' "$PGL/patroni-b.log") >= 1)) && break
    sleep 0.2
  done
  lab_expect "B's pre_promote fails without its path to LU 0" grep -q 'pre_promote script .* exited with [1-9]' "$PGL/patroni-b.log"
  lab_log "B's first pre_promote failed $(pgl_ms_since "$t_freeze") ms after the freeze"
  lab_expect "B's Patroni gives the leader lock up" grep -q 'Releasing the leader key voluntarily' "$PGL/patroni-b.log"
  lab_expect_read "B stays in recovery" t pgl_psql B "SELECT pg_is_in_recovery()"
  lab_expect_read "B stays on timeline $timeline" "$timeline" pgl_psql B "SELECT timeline_id FROM pg_control_checkpoint()"
  lab_expect "A's key still holds LU 0 (read through A)" eval \
    '[[ $(lab_holder_key "$(lab_dev A 0)") =~ ^0x${cluster_prefix}0001[0-9a-f]{8}$ ]]'
  lab_expect "B's path to LU 0 is back" eval "echo running >'$b_path0'"
  t_back=$EPOCHREALTIME
fi
lab_expect "B takes the leader lock and promotes" pgl_await_promoted B 600
freeze_to_primary_ms=$(pgl_ms_since "$t_freeze")
lab_log "B primary $freeze_to_primary_ms ms after the freeze${t_back:+, $(pgl_ms_since "$t_back") ms after its path came back}"
# pre_promote's run time: the hook's own start line and Patroni's line on its exit status.
hook_ms=$(awk '
  /blkfence-patroni-hook: pre_promote / { split($4, t, ":"); start = t[1] * 3600 + t[2] * 60 + t[3] }
  /pre_promote script .* exited with / && start != "" { split($2, t, "[:,]"); end = t[1] * 3600 + t[2] * 60 + t[3] + t[4] / 1000 }
  END { if (start != "" && end != "") printf "%d", (end - start) * 1000 }' "$PGL/patroni-b.log")
[[ $mode == fence ]] && lab_log "pre_promote took ${hook_ms:-?} ms"
if [[ $mode == fence ]]; then
  lab_expect_read "B's pre_promote made B the holder of both LUs" "${node_id[B]}" holder_node
  lab_expect "pre_promote exited 0" grep -q 'pre_promote script .* exited with 0' "$PGL/patroni-b.log"
else
  lab_expect_read "(control) A's key still holds both LUs" "${node_id[A]}" holder_node
fi
ok_before=$(pgl_count '^ok ' "$PGL/client.log")
for ((try = 0; try < 300; try++)); do
  (($(pgl_count '^ok ' "$PGL/client.log") >= ok_before + 5)) && break
  sleep 0.2
done
lab_expect "the client carries on against B" test "$(pgl_count '^ok ' "$PGL/client.log")" -ge $((ok_before + 5))

# --- the stale primary ---------------------------------------------------------------------------
lab_expect "A's postmaster group (alone) is resumed" kill -CONT -- "-$postmaster_a"
touch "$PGL/stale.go"
t_stale=$EPOCHREALTIME
for ((try = 0; try < 400; try++)); do
  [[ $(cat "$PGL/stale.state") != ready ]] && break
  sleep 0.1
done
stale=$(cat "$PGL/stale.state")
lab_log "stale session after $(pgl_ms_since "$t_stale") ms: $stale"
luA=$lab_lu_dir/lu${pgl_lu[A]}.img luB=$lab_lu_dir/lu${pgl_lu[B]}.img
sleep 1  # what A's postmaster still does after the answer, it does now
if [[ $mode == fence ]]; then
  lab_expect "the stale commit is not acknowledged" test "${stale%% *}" = error
  lab_expect "the marker is on no LU (A's and B's backing files)" eval "! grep -q -a '$marker' '$luA' '$luB'"
  conflicts=$(dmesg | tail -n +$((dmesg_lines + 1)) | grep -c "sd $(lab_dev A 0 hctl): reservation conflict")
  lab_expect "the kernel logs reservation conflicts on A's nexus to LU 0 ($conflicts)" test "$conflicts" -ge 1
else
  lab_expect_eq "(control) the stale commit is acknowledged" "$stale" committed
  lab_expect "(control) the marker is on A's LU" grep -q -a "$marker" "$luA"
fi
lab_expect_read "the marker row is not on B" 0 pgl_psql B "SELECT count(*) FROM t WHERE note = '$marker'"

# --- rejoin: the old primary comes back as a replica (integrations/patroni/README.md) -------------
if [[ $rejoin == rejoin ]]; then
  t0=$EPOCHREALTIME
  # What stopping the service does to a frozen node: Patroni and PostgreSQL killed.
  kill -KILL "$patroni_a" 2>/dev/null
  kill -KILL -- "-$postmaster_a" 2>/dev/null
  # Exited processes have closed their files (the mount is free) even while they are zombies.
  for ((try = 0; try < 100; try++)); do
    bf_alive "$patroni_a" || break
    sleep 0.1
  done
  sleep 0.5
  lab_expect "A's file system is unmounted" umount /lab/pg/a
  lab_expect "A registers its member key again (unfence)" member A unfence pg
  a_dev=$(lab_dev A "${pgl_lu[A]}")
  e2fsck -f -y "$a_dev" >"$PGL/fsck-a.log" 2>&1
  lab_expect "fsck repairs A's file system (exit $?, at most 1: errors corrected)" test "$?" -le 1
  lab_expect "A's file system is mounted again" mount -o noatime "$a_dev" /lab/pg/a
  pgl_patroni_start A
  lab_expect "A rejoins as a replica of B" pgl_await A /replica 900
  for ((try = 0; try < 150; try++)); do
    [[ $(pgl_psql B "SELECT state FROM pg_stat_replication WHERE application_name = 'pg-a'" 2>/dev/null) == streaming ]] && break
    sleep 0.2
  done
  lab_expect_read "B streams to A" streaming pgl_psql B "SELECT state FROM pg_stat_replication WHERE application_name = 'pg-a'"
  lab_log "rejoin: A streaming from B $(pgl_ms_since "$t0") ms after it was stopped"
  lab_expect "a row written on B" pgl_psql B "INSERT INTO t (id, note) VALUES (-2, 'after rejoin')"
  for ((try = 0; try < 150; try++)); do
    [[ $(pgl_psql A "SELECT count(*) FROM t WHERE id = -2" 2>/dev/null) == 1 ]] && break
    sleep 0.2
  done
  lab_expect_read "reaches A" 1 pgl_psql A "SELECT count(*) FROM t WHERE id = -2"
  lab_expect_read "the stale row is not on A either" 0 pgl_psql A "SELECT count(*) FROM t WHERE note = '$marker'"
fi

# --- no acknowledged commit lost -----------------------------------------------------------------
touch "$PGL/client.stop"
wait "$(cat "$PGL/client.pid")"
acked=$(awk '$1 == "ok" { print $2 }' "$PGL/client.log" | sort -n)
lab_capture on_b pgl_psql B "SELECT id FROM t WHERE id > 0 ORDER BY id"
missing=$(comm -23 <(sort <<<"$acked") <(sort <<<"$on_b") | tr '\n' ' ')
lab_log "client: $(wc -l <<<"$acked") commits acknowledged, $(pgl_count '^fail ' "$PGL/client.log") failed or timed out"
lab_expect_eq "every id the client recorded is on B" "$missing" ""
lab_expect "the client recorded ids at all" test -n "$acked"
dmesg | tail -n +$((dmesg_lines + 1)) >"$BLKFENCE_LAB_OUT/patroni-$mode-dmesg.log"
lab_done

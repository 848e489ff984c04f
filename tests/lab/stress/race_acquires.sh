#!/bin/bash
# Stress: racing acquires of one resource by two blkfenced, ROUNDS times in a row, as a cluster
# manager that promotes two nodes at once would cause. In each round A and B acquire "db" at the
# same moment; each acquire must succeed or lose cleanly (exit 0 or 4), and the round must end with
# exactly one open gate and the winner's key alone on every LU. On LIO 6.1 the two nodes' PR OUTs
# overlap in the target here (one node re-keys its registration while the other preempts it), the
# pattern of the PR OUT deadlock in tests/lab/README.md; a wedge ends the boot (exit 125).
#   usage: race_acquires.sh ROUNDS PREEMPT DB_LUS    e.g. race_acquires.sh 100 preempt-and-abort 0,1
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
rounds=$1 preempt=$2 db_lus=${3//,/ }
rm -rf "$BF"
bf_clear $db_lus
bf_config A 1 "$preempt" "$db_lus" "" 500ms 3s
bf_config B 2 "$preempt" "$db_lus" "" 500ms 3s
lab_expect "A's daemon starts" bf_start A
lab_expect "B's daemon starts" bf_start B
bad="" wins_a=0 wins_b=0 holder="" keys=""
for ((round = 1; round <= rounds; round++)); do
  bf_ctl A acquire db --timeout 30s >/dev/null 2>&1 &
  race_a=$!
  bf_ctl B acquire db --timeout 30s >/dev/null 2>&1 &
  race_b=$!
  wait "$race_a"; rc_a=$?
  wait "$race_b"; rc_b=$?
  [[ ($rc_a == 0 || $rc_a == 4) && ($rc_b == 0 || $rc_b == 4) && ($rc_a == 0 || $rc_b == 0) ]] ||
    { bad="round $round: A exited $rc_a, B exited $rc_b"; break; }
  lab_capture holder bf_holders_everywhere $db_lus || { bad="round $round: $holder"; break; }
  winner=A loser=B
  [[ $holder == "$(bf_field B db key) " ]] && winner=B loser=A
  [[ $holder == "$(bf_field "$winner" db key) " ]] || { bad="round $round: holders '$holder' are not one racer's key"; break; }
  bf_await "$loser" db gate_open false >/dev/null || { bad="round $round: $loser's gate stays open"; break; }
  lab_capture keys bf_keys_everywhere $db_lus || { bad="round $round: $keys"; break; }
  [[ $keys == "$holder" ]] || { bad="round $round: keys '$keys' beside holder $holder"; break; }
  [[ $winner == A ]] && wins_a=$((wins_a + 1)) || wins_b=$((wins_b + 1))
  ((round % 10 == 0)) && lab_log "round $round: A won $wins_a, B won $wins_b"
done
lab_expect_eq "every round ended with one holder and one open gate" "${bad:-yes}" yes
lab_log "A won $wins_a rounds, B won $wins_b"
bf_stop A
bf_stop B
bf_clear $db_lus
lab_done

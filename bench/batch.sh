#!/bin/bash
# The in-process side of the fencing benchmark, run inside the lab guest after bench/fence.sh: the
# time blkfencectl's one batch of PREEMPT (AND ABORT) takes from the first submission to the last
# completion, without process start, discovery and ring set-up. blkfencectl reports every
# command's latency in --json; all commands of the batch go out at once, so the batch takes as
# long as its slowest command. Appends "action blkfencectl-batch n seconds verified" lines to
# $BENCH_OUT, verified as bench/fence.sh verifies.
set -u
. "$BLKFENCE_LAB_REPO/bench/fence.sh" --functions-only
for n in $sizes; do
  a=("${a_all[@]:0:n}") b=("${b_all[@]:0:n}")
  for ((r = 0; r < repeats; r++)); do
    for abort in preempt preempt-abort; do
      [[ $abort == preempt-abort && $LAB_FABRIC == tcm_loop ]] && continue
      setup || exit 1
      json=$("$BLKFENCECTL" device "$abort" --key "$kb" --victim "$ka" --json "${b[@]}")
      seconds=$(python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.4f" % (max(a["latency_us"] for l in d["lus"] for a in l["attempts"]) / 1e6))' <<<"$json")
      verified=no
      fenced && verified=yes
      printf '%s\t%s\t%s\t%s\t%s\n' "$abort" blkfencectl-batch "$n" "$seconds" "$verified" | tee -a "$out"
    done
  done
done

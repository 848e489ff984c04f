#!/bin/bash
# Proves one blkfencectl batch over every LU of the topology (64 in the lab test): A registers and
# reserves on all of them in one call each, B preempts A on all of them in one call, and sg_persist
# from the other node confirms the effect on every LU.
#   usage: batch.sh TRANSPORT
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
transport=${1:?transport}
ka=0x6c9d0001000000c1 kb=0x6c9d0002000000c2
mapfile -t a_devs < <(awk -F'\t' '$1 == "A" {print $5}' "$BLKFENCE_LAB_MAP")
mapfile -t b_devs < <(awk -F'\t' '$1 == "B" {print $5}' "$BLKFENCE_LAB_MAP")
lab_expect_eq "the map lists every LU for A and for B" "${#a_devs[@]} ${#b_devs[@]}" "$LAB_LUNS $LAB_LUNS"
ctl() { "$BLKFENCECTL" device "$@" --transport "$transport"; }
# Both nexuses of every LU may hold a unit attention from earlier checks; take them first.
for dev in "${a_devs[@]}" "${b_devs[@]}"; do lab_pr -k "$dev" >/dev/null 2>&1; done

lab_log "A registers on ${#a_devs[@]} LUs in one batch ($transport)"
lab_expect "A registers on every LU at once" ctl register --key "$ka" "${a_devs[@]}"
lab_expect "B registers on every LU at once" ctl register --key "$kb" "${b_devs[@]}"
lab_expect "A reserves every LU at once" ctl reserve --key "$ka" "${a_devs[@]}"
start=$EPOCHREALTIME
json=$(ctl preempt --key "$kb" --victim "$ka" --json "${b_devs[@]}")
lab_log "B preempted A on ${#b_devs[@]} LUs in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.3f", b - a}') s (one blkfencectl run)"
lab_expect_eq "the preempt succeeded on every LU" \
  "$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["exit"], sum(l["ok"] for l in d["lus"]))' <<<"$json")" \
  "0 ${#b_devs[@]}"
# A LU that cannot be read is listed with the reason, like one with the wrong keys.
bad="" keys="" holder=""
for dev in "${a_devs[@]}"; do
  lab_capture keys lab_keyset "$dev"
  [[ $keys == "$kb " ]] || bad+=" $dev:keys=$keys"
  lab_capture holder lab_holder "$dev"
  [[ $holder == "$kb "* ]] || bad+=" $dev:holder=$holder"
done
lab_expect_eq "sg_persist from A: only B's key, B holds, on every LU" "$bad" ""
lab_expect "B clears every LU at once" ctl clear --key "$kb" "${b_devs[@]}"
lab_done

#!/bin/bash
# The fencing benchmark, run inside the lab guest (bench/run boots it): node B fences node A on the
# first N LUs, N in $BENCH_SIZES, with (a) one blkfencectl batch, (b) a sg_persist loop, (c)
# fence_scsi -o off from Debian's fence-agents; and registers (unfences) itself with the same three,
# fence_scsi -o on for (c). Every method starts from the same state (A holds type 5 with key KA, B
# is registered with KB; or, for unfencing, B unregistered) and its effect is verified afterwards
# with sg_persist from A's nexus. Times are wall-clock, process start included, as an operator
# would see them. Output: TSV lines "action method n seconds verified" in $BENCH_OUT.
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
# fence_scsi compares keys as hex without "0x" (it strips leading zeros), so it gets them bare.
ka=0x6c9d000100000001 kb=0x6c9d000200000002
sizes=${BENCH_SIZES:-1 16 64}
repeats=${BENCH_REPEATS:-2}
out=${BENCH_OUT:-$BLKFENCE_LAB_OUT/bench.tsv}
fence_log=$BLKFENCE_LAB_OUT/fence_scsi.log
mapfile -t a_all < <(awk -F'\t' '$1 == "A" {print $5}' "$BLKFENCE_LAB_MAP")
mapfile -t b_all < <(awk -F'\t' '$1 == "B" {print $5}' "$BLKFENCE_LAB_MAP")
# Quiet on success; a failure says what failed (the setup steps must not fail silently).
ctl() {
  local output
  output=$("$BLKFENCECTL" device "$@" 2>&1) || { echo "blkfencectl device $*: $output" >&2; return 1; }
}
now() { printf '%s' "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN {printf "%.4f", b - a}'; }
comma() { local IFS=,; echo "$*"; }
[[ ${1:-} == --functions-only ]] || echo -e "action\tmethod\tn\tseconds\tverified" >"$out"

# The first n LUs: no keys, no reservation (pending unit attentions are retried by blkfencectl;
# setup clears B's with sg_turs, as fence_scsi does itself, for the sg_persist loop).
reset() {
  ctl register --key "$ka" "${a[@]}"
  ctl clear --key "$ka" "${a[@]}"
  rm -f /var/run/cluster.key /var/run/cluster.dev
}
# A holds type 5 on the first n LUs; B is registered (or not, with "unregistered").
setup() {
  local b_state=${1:-registered}
  reset
  ctl register --key "$ka" "${a[@]}" && ctl reserve --key "$ka" "${a[@]}" || return 1
  if [[ $b_state == registered ]]; then
    ctl register --key "$kb" "${b[@]}" || return 1
    echo "${kb#0x}" >/var/run/cluster.key  # what fence_scsi -o on would have left for B
  fi
  local d
  for d in "${b[@]}"; do sg_turs "$d" >/dev/null 2>&1; done  # a UA here is what it is for
  return 0
}
# Reads keys and holder of the first n LUs through A's nexuses (one blkfencectl batch), and checks
# the first and the last with sg_persist as an independent witness. $1: the wanted keys.
state_is() {
  local want_keys=$1 want_holder=$2
  local keys holders
  keys=$("$BLKFENCECTL" device keys --json "${a[@]}" 2>/dev/null) || return 1
  holders=$("$BLKFENCECTL" device reservation --json "${a[@]}" 2>/dev/null) || return 1
  python3 - "$want_keys" "$want_holder" "$keys" "$holders" <<'PY' || return 1
import json, sys
want_keys, want_holder, keys, holders = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
ok = all(" ".join(sorted(l["keys"])) == want_keys for l in keys["lus"])
ok = ok and all(l["reservation"] and l["reservation"]["key"] == want_holder for l in holders["lus"])
sys.exit(0 if ok else 1)
PY
  local d
  for d in "${a[0]}" "${a[-1]}"; do
    [[ $(lab_keys "$d" 2>/dev/null | sort | tr '\n' ' ') == "$want_keys " ]] || return 1
    lab_holder "$d" 2>/dev/null | grep -q "^$want_holder " || return 1
  done
}
fenced() { state_is "$kb" "$kb"; }
unfenced() { state_is "$ka $kb" "$ka"; }
record() {  # action method n start verify-function
  local verified=no
  local seconds
  seconds=$(elapsed "$4")
  "$5" && verified=yes
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$seconds" "$verified" | tee -a "$out"
}

[[ ${1:-} == --functions-only ]] && return 0  # sourced by bench/batch.sh
for n in $sizes; do
  a=("${a_all[@]:0:n}") b=("${b_all[@]:0:n}")
  for ((r = 0; r < repeats; r++)); do
    for abort in preempt preempt-abort; do
      [[ $abort == preempt-abort && $LAB_FABRIC == tcm_loop ]] && continue  # deadlocks LIO 6.1
      sg_flag=-P
      [[ $abort == preempt-abort ]] && sg_flag=-A

      setup || { echo "setup failed"; exit 1; }
      t=$(now); ctl "$abort" --key "$kb" --victim "$ka" "${b[@]}"
      record "$abort" blkfencectl "$n" "$t" fenced

      setup || exit 1
      t=$(now)
      for d in "${b[@]}"; do sg_persist -n -o "$sg_flag" -T 5 -K "$kb" -S "$ka" "$d" >/dev/null 2>&1; done
      record "$abort" sg_persist-loop "$n" "$t" fenced

      if [[ $abort == preempt-abort ]]; then
        setup || exit 1
        t=$(now); fence_scsi -o off -k "${ka#0x}" -d "$(comma "${b[@]}")" >>"$fence_log" 2>&1
        record "$abort" fence_scsi "$n" "$t" fenced
      fi
    done

    setup unregistered || exit 1
    t=$(now); ctl register --key "$kb" "${b[@]}"
    record unfence blkfencectl "$n" "$t" unfenced

    setup unregistered || exit 1
    t=$(now)
    for d in "${b[@]}"; do sg_persist -n -o -I -S "$kb" "$d" >/dev/null 2>&1; done
    record unfence sg_persist-loop "$n" "$t" unfenced

    setup unregistered || exit 1
    t=$(now); fence_scsi -o on -k "${kb#0x}" -d "$(comma "${b[@]}")" >>"$fence_log" 2>&1
    record unfence fence_scsi "$n" "$t" unfenced
  done
done

# Helpers for lab tests running inside the guest (sourced; bash).
#
# Device lookup in the node -> LU map, sg_persist wrappers that retry unit attentions (the first
# command on a fresh nexus and every command after a preemption may get one; docs/design.md §7), O_DIRECT
# writes that report the errno text, and TAP-like checks that end in "N passed, N failed".

# The job's topology (LAB_FABRIC, LAB_NODES, LAB_LUNS) and the helpers naming its identities.
. "$BLKFENCE_LAB_OUT/job.env"
. "$BLKFENCE_LAB_REPO/tests/lab/guest/topology.sh"
lab_enable_builtins

lab_checks_passed=0
lab_checks_failed=0
lab_t0=$EPOCHREALTIME

# lab_dev NODE LU [FIELD]: a column of the map (FIELD: sd (default), sg, wwn, serial, hctl).
lab_dev() {
  local node=$1 lu=$2 field=${3:-sd}
  awk -F'\t' -v node="$node" -v lu="$lu" -v field="$field" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $1 == node && $2 == lu { print $col[field]; found = 1 }
    END { exit !found }' "$BLKFENCE_LAB_MAP"
}

# Timeline line: seconds since the test started, then the text.
lab_log() { awk -v t0="$lab_t0" -v now="$EPOCHREALTIME" -v text="$*" 'BEGIN { printf "[%7.3fs] %s\n", now - t0, text }'; }

lab_ok() { lab_checks_passed=$((lab_checks_passed + 1)); printf 'ok - %s\n' "$*"; }
lab_not_ok() { lab_checks_failed=$((lab_checks_failed + 1)); printf 'not ok - %s\n' "$*"; }

# lab_expect_eq DESCRIPTION GOT WANT
lab_expect_eq() {
  if [[ $2 == "$3" ]]; then lab_ok "$1"; else lab_not_ok "$1: got '$2', want '$3'"; fi
}

# lab_expect DESCRIPTION COMMAND...: the command must succeed.
lab_expect() {
  local desc=$1 output
  shift
  if output=$("$@" 2>&1); then lab_ok "$desc"; else lab_not_ok "$desc: '$*' failed: $output"; fi
}

lab_done() {
  printf '%d passed, %d failed\n' "$lab_checks_passed" "$lab_checks_failed"
  ((lab_checks_failed == 0 && lab_checks_passed > 0))
}

# sg_persist with unit attentions retried (exit status 6 is sg3_utils' SG_LIB_CAT_UNIT_ATTENTION).
# A command that got a UA did not execute, so repeating it is safe.
lab_pr() {
  local try rc=0
  for ((try = 0; try < 5; try++)); do
    sg_persist -n "$@" && return 0
    rc=$?
    ((rc == 6)) || return "$rc"
    echo "lab_pr: unit attention on $*; retrying" >&2
  done
  return "$rc"
}

# Registered keys, one per line, lowercase hex with 0x (one line per registration, i.e. per nexus).
lab_keys() { lab_pr -k "$1" | awk '/^ *0x/ {print tolower($1)}'; }
# "KEY TYPE-TEXT" of the reservation, or "none".
lab_holder() {
  lab_pr -r "$1" | awk '
    /NO reservation/ { print "none"; exit }
    /Key=/ { sub(/.*Key=/, ""); key = tolower($0) }
    /type:/ { sub(/.*type: */, ""); print key, $0; exit }'
}

# lab_write DEV BLOCK TEXT: one 4 KiB O_DIRECT write of TEXT (padded with NULs) at 4 KiB block BLOCK.
# Prints dd's error (for example "Invalid exchange" for EBADE) and returns its status.
lab_write() {
  local dev=$1 block=$2 text=$3 err
  err=$(printf '%s' "$text" | dd of="$dev" bs=4096 seek="$block" count=1 conv=sync,notrunc \
    oflag=direct iflag=fullblock status=none 2>&1) && return 0
  printf '%s\n' "${err##*: }"
  return 1
}

# lab_read DEV BLOCK: the text stored in a 4 KiB block (up to the first NUL), read with O_DIRECT.
lab_read() {
  dd if="$1" bs=4096 skip="$2" count=1 iflag=direct status=none | tr -d '\0'
}

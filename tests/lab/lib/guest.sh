# Helpers for lab tests running inside the guest (sourced; bash).
#
# Device lookup in the node -> LU map, sg_persist wrappers that retry unit attentions (the first
# command on a fresh nexus and every command after a preemption may get one; docs/design.md §7), O_DIRECT
# writes that report the errno text, and TAP-like checks that end in "N passed, N failed".
#
# The lab fails closed: a read helper (lab_keys, lab_holder, ...) that cannot read fails, with its
# reason on stderr, instead of printing nothing; checks built on reads use lab_expect_read, which
# turns a failed read into a failed check; an empty or malformed key never matches (lab_is_key).
# Pipelines fail when any of their commands does (pipefail), so capture a command's output before
# matching it: `cmd | grep -q` can fail the pipeline when grep exits first and cmd gets SIGPIPE.
set -o pipefail

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

# lab_capture VAR COMMAND...: runs a read and sets VAR to what it printed on stdout; its stderr
# (unit attentions retried, say) passes through and is never part of VAR. When the read fails, VAR
# says so ("the read failed: 'COMMAND' exited N: its stderr") and lab_capture returns 1.
# shellcheck disable=SC2034 # lab_capture_var is a name reference: it sets the caller's VAR
lab_capture() {
  local -n lab_capture_var=$1
  local rc err=${TMPDIR:-/tmp}/lab_capture.$BASHPID
  shift
  lab_capture_var=$("$@" 2>"$err")
  rc=$?
  if ((rc != 0)); then
    lab_capture_var="the read failed: '$*' exited $rc: $(tr '\n' ' ' <"$err")"
  elif [[ -s $err ]]; then
    cat "$err" >&2
  fi
  rm -f "$err"
  ((rc == 0))
}

# lab_expect_read DESCRIPTION WANT COMMAND...: COMMAND reads something (keys, a holder, a status
# field); the check passes only if the read succeeds and prints WANT. A failed read is a failed check
# that says why, never an empty answer that happens to match an expected "" ("no keys").
lab_expect_read() {
  local desc=$1 want=$2 got
  shift 2
  if ! lab_capture got "$@"; then
    lab_not_ok "$desc: $got"
  elif [[ $got == "$want" ]]; then
    lab_ok "$desc"
  else
    lab_not_ok "$desc: got '$got', want '$want'"
  fi
}

# lab_is_key STRING: STRING is a reservation key as the helpers print it (0x and 1-16 lowercase hex
# digits). An empty string is not a key, so an unset key never "matches" a read.
lab_is_key() { [[ $1 =~ ^0x[0-9a-f]{1,16}$ ]]; }

# lab_expect_key DESCRIPTION KEY COMMAND...: as lab_expect_read with WANT=KEY, and KEY must be a key:
# a key that was never learnt (an empty string from a failed read) fails the check.
lab_expect_key() {
  if lab_is_key "$2"; then
    lab_expect_read "$@"
  else
    lab_not_ok "$1: the expected key '$2' is not a key"
  fi
}

# lab_require DESCRIPTION COMMAND...: lab_expect for a step that everything after it needs: a
# failure ends the check at once (exit 1; its EXIT trap tears down and saves the logs), instead of
# failing every later step on what this one did not build.
lab_require() {
  local failed_before=$lab_checks_failed
  lab_expect "$@"
  ((lab_checks_failed == failed_before)) && return 0
  echo "lab: '$1' failed; the check stops here"
  lab_done
  exit 1
}

# lab_keep_logs DIR NAME: when the watchdog ends the test at its deadline, the files named *.log or
# log under DIR reach the host in kept-logs/NAME/ (tests/lab/guest/job.sh) before the guest powers
# off: a check that hangs still says why. A check saves its logs itself when it ends. Outside a lab
# job (the host's unit tests of these helpers) there is no watchdog, and nothing to register.
lab_keep_logs() {
  [[ -n ${BLKFENCE_LAB_KEEP_LOGS:-} ]] || return 0
  local line
  line=$(printf '%s\t%s' "$1" "$2")
  grep -qxF -- "$line" "$BLKFENCE_LAB_KEEP_LOGS" 2>/dev/null ||
    printf '%s\n' "$line" >>"$BLKFENCE_LAB_KEEP_LOGS"
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

# lab_keys DEV: the registered keys, one per line, lowercase hex with 0x (one line per registration,
# i.e. per nexus). Fails (with the reason on stderr) when sg_persist fails or its answer is not a
# READ KEYS report with as many keys as it announces: a failed read is never "no keys".
lab_keys() {
  local out
  out=$(lab_pr -k "$1") || { echo "lab_keys: sg_persist -k $1 failed (exit $?)" >&2; return 1; }
  awk -v dev="$1" '
    /PR generation=0x[0-9a-fA-F]+, there are NO registered reservation keys/ { headers++; want = 0; next }
    /PR generation=0x[0-9a-fA-F]+, [0-9]+ registered reservation keys? follows?:/ {
      headers++; sub(/.*PR generation=0x[0-9a-fA-F]+, /, ""); want = $1 + 0; next
    }
    headers == 1 && /^ *0x[0-9a-fA-F]+ *$/ { keys[++got] = tolower($1); next }
    END {
      if (headers != 1 || got != want) {
        printf "lab_keys: %s: not a READ KEYS report (%d headers, %d of %d keys)\n", dev, headers, got, want > "/dev/stderr"
        exit 1
      }
      for (i = 1; i <= got; i++) print keys[i]
    }' <<<"$out"
}

# lab_keyset DEV: the registered keys as one sorted line, each followed by a space ("" when none).
lab_keyset() {
  local keys
  keys=$(lab_keys "$1") || return 1
  [[ -z $keys ]] || sort <<<"$keys" | tr '\n' ' '
}

# lab_holder DEV: "KEY TYPE-TEXT" of the reservation, or "none". Fails (with the reason on stderr)
# when sg_persist fails or its answer is not a READ RESERVATION report.
lab_holder() {
  local out
  out=$(lab_pr -r "$1") || { echo "lab_holder: sg_persist -r $1 failed (exit $?)" >&2; return 1; }
  awk -v dev="$1" '
    /PR generation=0x[0-9a-fA-F]+, there is NO reservation held/ { headers++; holder = "none"; next }
    /PR generation=0x[0-9a-fA-F]+, Reservation follows:/ { headers++; held = 1; next }
    held && /^ *Key=0x[0-9a-fA-F]+ *$/ { sub(/.*Key=/, ""); key = tolower($1); next }
    held && key != "" && / type: / { sub(/.* type: */, ""); holder = key " " $0; held = 0; next }
    END {
      if (headers != 1 || holder == "") {
        printf "lab_holder: %s: not a READ RESERVATION report\n", dev > "/dev/stderr"
        exit 1
      }
      print holder
    }' <<<"$out"
}

# lab_holder_key DEV: the key that holds the reservation, or "none" (fails as lab_holder does).
lab_holder_key() {
  local holder
  holder=$(lab_holder "$1") || return 1
  printf '%s\n' "${holder%% *}"
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
# Fails when the read fails (dd's error on stderr): an unreadable block is not an empty one.
lab_read() {
  dd if="$1" bs=4096 skip="$2" count=1 iflag=direct status=none | tr -d '\0'
}

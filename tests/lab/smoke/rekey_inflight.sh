#!/bin/bash
# Proves, on the data of a LU, that PREEMPT AND ABORT aborts commands by the key that held the
# reservation when LIO accepted them, not by the I_T nexus that sent them: a holder that re-keys
# with writes in flight is preempted without them being aborted, and they land afterwards. LIO
# (target_core_pr.c) stamps every command with the key of the reservation holder at the moment it
# accepts it; PREEMPT AND ABORT aborts (and waits for) the commands whose stamp is a key on its
# abort list: the registrations it removes, plus the preemptor's own when the service action key is
# the holder's.
#
# The LU is slow on purpose: an iblock backstore on a dm-delay device (writes held DELAY_MS, reads
# not delayed) over a loop device, exported in a portal group of its own (127.0.0.5, one ACL per
# node), so node A's O_DIRECT writes stay in flight at the backend while the PR commands run.
# Each case uses its own four blocks, marked "clean" first on the loop device (beneath the delay:
# at once); A's four writers each write one block once, with a text naming the case and the writer.
# B then writes two of the blocks; a dm-delay queue is FIFO, so B's writes land after any of A's
# already queued, and the two blocks B does not write (the witnesses) carry the proof.
#   control: A (key K1) holds Write Exclusive - Registrants Only with its four writes in flight at
#     the backend; A re-keys its holding nexus (REGISTER AND IGNORE EXISTING KEY, K2: the
#     reservation's key is now K2); B registers K3 and preempts-and-aborts K2. B's preempt returns
#     at once with A's writes still in flight (stamped K1, on no abort list), the witnesses read
#     clean right after it, A's writers all succeed, and afterwards A's texts are on the witnesses:
#     A's writes landed after B's preempt returned. The window blkfence closes.
#   drain: the same, but A re-keys only once the kernel counts no write of A's in flight on the LU
#     (/sys/block/NAME/inflight), as blkfenced does (docs/protocol.md, "Re-keying a holding
#     nexus"). A's writes have left the backend before the re-key, the witnesses carry A's texts
#     right after B's preempt, and nothing of A's lands after it.
#   daemon-mutant, daemon: the same with blkfenced on both nodes (below, run_daemon_case): A
#     acquires, its writes go in flight, A releases and acquires again (a re-key of its holding
#     nexus), B acquires. blkfenced waits for A's writes before the re-key, says so in its status,
#     and nothing of A's lands after B's acquire returned; built with the rekey_without_drain
#     mutant it re-keys at once, and A's writes land after B's acquire returned.
#   takeover, promote, takeover-preempt, promote-preempt: a plain takeover with blkfenced on both
#     nodes (below, run_takeover_case): A holds, exclusive or primary mode, with its writes in
#     flight at the backend, and B acquires or promotes. With PREEMPT AND ABORT, B's operation
#     returns only once A's writes have left the backend, and nothing of A's lands after it; the
#     control runs with preempt = "preempt" show A's writes landing after B's operation returned.
#   queued, queued-mutant: writes queued in the initiator, not the target (below, run_queued_case):
#     A's writes wait in a dm-multipath map of A's with queue_if_no_path and no path while B
#     promotes; A rejoins and the path comes back. blkfenced stops the map queueing as A's gate
#     closes, so they fail there and nothing lands; the keep_host_queues mutant lets them land.
#   recovery, recovery-mutant: writes held in a blocked SCSI device (below, run_recovery_case): A's
#     second path to the LU is an iSCSI session in recovery, its writes wait there unstarted while
#     B acquires; A acquires again. blkfenced waits while the path is blocked, and its writes are
#     refused once the session is back; the rekey_without_drain mutant registers at once, its
#     REGISTER goes out first, and A's writes land.
#   Aborting A's writes instead, with a PREEMPT AND ABORT of K1 by A through its only nexus,
#   wedges LIO's iSCSI target on Debian 12's 6.1 (TAS on, LIO's default; docs/reference/lio.md
#   §6), and with TAS off lets A's initiator resend the writes, stamped K1 again, when the backend
#   outlasts its iSCSI ping timeout: an earlier version of this check showed both
#   (tests/lab/README.md, "Limits"); `notas` builds the LU with TAS off to study it.
# Prints each PR command's duration, what A's writers saw and when, the writes at the backend at
# each step, and the kernel's log of the commands each PREEMPT AND ABORT aborted (dynamic debug of
# target_core_tmr.c) and of A's connection.
#   usage: rekey_inflight.sh [notas] [CASE...]   (CASE: control, drain, daemon-mutant, daemon,
#   takeover, takeover-preempt, promote, promote-preempt, queued-mutant, queued, recovery-mutant,
#   recovery; default all twelve)
#   notas builds the LU with attrib/emulate_tas 0 (LIO takes it only before the LU is exported).
#   REKEY_DELAY_MS overrides the write delay (default 4000). A's writes must still be held when
#   B's preempt returns: from A's writes going in flight to that took at most 0.8 s under TCG in
#   CI (each process start costs about 0.3 s there), and every control case checks that they were
#   held, so a delay too short for the machine fails the check instead of weakening it.
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
# shellcheck source=tests/lab/daemon/lib.sh
. "$BLKFENCE_LAB_REPO/tests/lab/daemon/lib.sh"
delay_ms=${REKEY_DELAY_MS:-4000}
tas=1
cases=()
for arg; do
  if [[ $arg == notas ]]; then tas=0; else cases+=("$arg"); fi
done
((${#cases[@]})) || cases=(control drain daemon-mutant daemon takeover takeover-preempt promote promote-preempt queued-mutant queued recovery-mutant recovery)
[[ $LAB_FABRIC == iscsi ]] || { lab_not_ok "rekey_inflight.sh needs the iscsi fabric (PREEMPT AND ABORT deadlocks over tcm_loop)"; lab_done; exit; }
k1=0x7265000100000001 k2=0x7265000100000002 k3=0x7265000200000003
writers=4 witnesses=(2 3) b_first=0 b_count=2
portal=127.0.0.5 portal2=127.0.0.6
tpg=$lab_cfs/iscsi/$lab_iscsi_target/tpgt_3
backstore=$lab_cfs/core/iblock_0/lu_rekey
dm_name=lab_rekey_delay mp_name=lab_rekey_queue
img=$lab_lu_dir/lu_rekey.img
serial=b1f0ce5e4e000000000000000000000
work=$(mktemp -d)
loopdev="" dm="" ddebug=""
declare -A dev host
writer_pids=()
a_devices=""

# logout_second: node A's second session (portal2, the recovery cases) gone, and its record.
logout_second() {
  iscsiadm -m node -T "$lab_iscsi_target" -p "$portal2:3260" -I lab-a --logout >/dev/null 2>&1
  iscsiadm -m node -T "$lab_iscsi_target" -p "$portal2:3260" -I lab-a -o delete >/dev/null 2>&1
}
cleanup() {
  local pid node acl
  for pid in "${writer_pids[@]}"; do kill "$pid" 2>/dev/null; done
  [[ -n $ddebug ]] && echo 'module target_core_mod file target_core_tmr.c -p' >"$ddebug" 2>/dev/null
  nft delete table inet bf_rekey >/dev/null 2>&1
  logout_second
  for node in a b; do
    iscsiadm -m node -T "$lab_iscsi_target" -p "$portal:3260" -I "lab-$node" --logout >/dev/null 2>&1
    iscsiadm -m node -T "$lab_iscsi_target" -p "$portal:3260" -I "lab-$node" -o delete >/dev/null 2>&1
  done
  for node in 1 2; do
    acl=$tpg/acls/$(lab_iscsi_initiator "$node")
    rm -f "$acl/lun_0/lun_0" 2>/dev/null
    rmdir "$acl/lun_0" "$acl" 2>/dev/null
  done
  rm -f "$tpg/lun/lun_0/lu_rekey" 2>/dev/null
  rmdir "$tpg/lun/lun_0" "$tpg/np/$portal:3260" "$tpg/np/$portal2:3260" 2>/dev/null
  [[ -d $tpg ]] && { echo 0 >"$tpg/enable"; rmdir "$tpg"; } 2>/dev/null
  rmdir "$backstore" 2>/dev/null
  dmsetup remove --noudevsync "$mp_name" >/dev/null 2>&1
  dmsetup resume "$dm_name" >/dev/null 2>&1
  dmsetup remove --noudevsync "$dm_name" >/dev/null 2>&1
  [[ -n $loopdev ]] && losetup -d "$loopdev" 2>/dev/null
  rm -rf "$img" "$work"
}
trap 'bf_stop A; bf_stop B; bf_save_logs; cleanup' EXIT

# The timeline in milliseconds since the check started, without a process (lab_log runs awk, and
# each process start costs about 0.3 s under TCG, while A's writes are held DELAY_MS).
now_ms() { echo $(((${EPOCHREALTIME/./} - ${lab_t0/./}) / 1000)); }
say() { local t; t=$(now_ms); printf '[%4d.%03ds] %s\n' $((t / 1000)) $((t % 1000)) "$*"; }

# The slow LU: loop device over a tmpfs file, dm-delay (reads 0 ms, writes and flushes DELAY_MS),
# iblock backstore, LUN 0 of portal group 3 mapped to node A's and node B's ACL.
make_lu() {
  local sectors n acl
  modprobe -a loop dm_delay target_core_iblock || return 1
  truncate -s 16M "$img" && loopdev=$(losetup --find --show "$img") || return 1
  sectors=$(blockdev --getsz "$loopdev") || return 1
  dmsetup create --noudevsync "$dm_name" \
    --table "0 $sectors delay $loopdev 0 0 $loopdev 0 $delay_ms" || return 1
  dm=$(dm_node "$dm_name") || { echo "no dm device named $dm_name"; return 1; }
  dm=${dm#/dev/}
  mkdir -p "$backstore" &&
    echo "udev_path=/dev/$dm" >"$backstore/control" &&
    echo 1 >"$backstore/enable" &&
    echo "$serial" >"$backstore/wwn/vpd_unit_serial" &&
    echo "$tas" >"$backstore/attrib/emulate_tas" || return 1
  mkdir -p "$tpg/np/$portal:3260" "$tpg/np/$portal2:3260" && mkdir "$tpg/lun/lun_0" &&
    ln -s "$backstore" "$tpg/lun/lun_0/lu_rekey" || return 1
  for n in 1 2; do
    acl=$tpg/acls/$(lab_iscsi_initiator "$n")
    mkdir -p "$acl/lun_0" && ln -s "$tpg/lun/lun_0" "$acl/lun_0/lun_0" || return 1
  done
  echo 0 >"$tpg/attrib/authentication" && echo 1 >"$tpg/enable"
}

# login NODE (a or b): the node's session to portal group 3.
login() {
  iscsiadm -m node -o new -T "$lab_iscsi_target" -p "$portal:3260,3" -I "lab-$1" >/dev/null &&
    iscsiadm -m node -T "$lab_iscsi_target" -p "$portal:3260" -I "lab-$1" --login >/dev/null
}

# find_dev NODE (1 or 2): sets dev[NODE] and host[NODE] once the node's session to portal group 3
# has its disk.
find_dev() {
  local s sid h b
  for s in /sys/class/iscsi_session/session*; do
    sid=${s##*session}
    [[ $(cat "$s/initiatorname") == "$(lab_iscsi_initiator "$1")" && $(cat "$s/tpgt") == 3 ]] || continue
    h=$(readlink -f "$s/device" | grep -o 'host[0-9]*' | tail -n 1) || return 1
    for b in /sys/class/scsi_host/"$h"/device/session"$sid"/target*/*/block/*; do
      [[ -e $b ]] || continue
      dev[$1]=/dev/${b##*/} host[$1]=${h#host}
      return 0
    done
  done
  return 1
}
both_devs() { find_dev 1 && find_dev 2; }

# step DESCRIPTION COMMAND...: a set-up step everything after it needs, run in this shell (it sets
# the names of what it builds; lab_require would run it in a subshell): its failure ends the check.
step() {
  local desc=$1
  shift
  if "$@" >"$work/step.log" 2>&1; then
    lab_ok "$desc"
  else
    lab_not_ok "$desc: $(tr '\n' ' ' <"$work/step.log")"
    lab_done
    exit 1
  fi
}

# await TRIES COMMAND...: polls every 0.05 s until COMMAND succeeds.
await() {
  local tries=$1 try
  shift
  for ((try = 0; try < tries; try++)); do "$@" && return 0; sleep 0.05; done
  return 1
}
# writers_ended CASE: each of A's writers of CASE wrote its end file (the daemons are jobs of this
# shell too, so `jobs` cannot tell).
writers_ended() { local w; for ((w = 0; w < writers; w++)); do [[ -f $work/$1.end.$w ]] || return 1; done; }
# a_writes_done DEV: the kernel counts no write in flight on DEV (/sys/block/NAME/inflight: reads,
# writes).
a_writes_done() { [[ $(a_writes "$1") == 0 ]]; }
# a_writes DEV: the writes the kernel counts in flight on DEV; a_writes_sent DEV COUNT: COUNT are.
a_writes() { local w; read -r _ w <"/sys/block/${1#/dev/}/inflight" && echo "$w"; }
a_writes_sent() { [[ $(a_writes "$1") == "$2" ]]; }

# At the backend (the dm-delay device): the writes it is holding (its status: "START LEN delay
# READS WRITES FLUSHES" held; 6.1's bio-based dm counts nothing in /sys/block/dm-N/inflight), and
# the writes it has completed since it was made.
backend_inflight() { local f; read -r -a f < <(dmsetup status "$dm_name") && echo "${f[4]}"; }
backend_done() { local f; read -r -a f <"/sys/block/$dm/stat" && echo "${f[4]}"; }
backend_has() { [[ $(backend_inflight) == "$1" ]]; }

# pr DESCRIPTION COMMAND...: a PR command as a check, its duration in pr_ms and on the timeline.
# sg_persist 0.67 (sg3_utils 1.46) exits 0 after a transport error (it prints
# "transport: Host_status=0x0e [DID_TRANSPORT_DISRUPTED]"): such a command failed here.
pr() {
  local desc=$1 t0=${EPOCHREALTIME/./} rc
  shift
  "$@" >"$work/pr.out" 2>"$work/pr.err"
  rc=$?
  pr_ms=$(((${EPOCHREALTIME/./} - t0) / 1000))
  say "$desc: $pr_ms ms"
  if ((rc == 0)) && ! grep -q 'transport: ' "$work/pr.err"; then
    lab_ok "$desc"
  else
    lab_not_ok "$desc (exit $rc): $(tr '\n' ' ' <"$work/pr.err")"
    return 1
  fi
}

# blocks FILE: the text of each 4 KiB block of FILE (up to its first NUL), "|"-separated.
# read_blocks DEV FIRST FILE: a case's blocks, in one O_DIRECT read (reads are not delayed).
blocks() {
  local k n out=""
  n=$(($(stat -c %s "$1") / 4096))
  for ((k = 0; k < n; k++)); do out+=$(dd if="$1" bs=4096 skip="$k" count=1 status=none | tr -d '\0')"|"; done
  printf '%s\n' "${out%|}"
}
read_blocks() { dd if="$1" of="$3" bs=4096 skip="$2" count="$writers" iflag=direct status=none; }
# block_file FILE TEXT...: one 4 KiB block per TEXT (NUL-padded), for one write of them all.
block_file() {
  local file=$1 k=0
  shift
  : >"$file"
  for text; do
    printf '%s' "$text" | dd of="$file" bs=4096 seek="$k" count=1 conv=sync,notrunc status=none || return 1
    k=$((k + 1))
  done
}
# mark FIRST FILE: the blocks of FILE written on the loop device, beneath the delay: at once.
mark() { dd if="$2" of="$loopdev" bs=4096 seek="$1" conv=notrunc oflag=direct status=none; }
# mark_clean CASE FIRST: the case's blocks read "clean CASE" (beneath the delay), and
# $work/CASE.b holds B's text for its b_count blocks.
mark_clean() {
  local case=$1 first=$2 k
  local -a clean_texts=() b_texts=()
  for ((k = 0; k < writers; k++)); do clean_texts[k]="clean $case"; done
  for ((k = 0; k < b_count; k++)); do b_texts[k]="B $case"; done
  block_file "$work/$case.clean" "${clean_texts[@]}" && block_file "$work/$case.b" "${b_texts[@]}" &&
    mark "$first" "$work/$case.clean" && return 0
  lab_not_ok "$case: marking the blocks clean failed"
  return 1
}
# b_writes CASE FIRST WHAT: right after B's WHAT returned, the case's blocks as B reads them into
# $work/CASE.s1 (read done at s1_read_us, on EPOCHREALTIME's clock in microseconds), then B's write
# of its blocks (queued behind any write of A's still held).
b_writes() {
  local case=$1 first=$2 what=$3 b=${dev[2]}
  read_blocks "$b" "$first" "$work/$case.s1" || lab_not_ok "$case: reading the blocks right after B's $what failed"
  s1_read_us=${EPOCHREALTIME/./}
  dd if="$work/$case.b" of="$b" bs=$((b_count * 4096)) seek=$(((first + b_first) / b_count)) oflag=direct \
    status=none 2>"$work/$case.b.err" || lab_not_ok "$case: B's write after its $what failed: $(cat "$work/$case.b.err")"
}
# writers_report CASE: waits for A's writers to end and the backend to hold nothing, then prints
# how each writer ended.
writers_report() {
  local case=$1 w st at err
  lab_expect "$case: every writer of A ended within 180 s" await 3600 writers_ended "$case"
  await 400 backend_has 0
  for ((w = 0; w < writers; w++)); do
    st="still running" at="?" err=""
    [[ -f $work/$case.end.$w ]] && read -r st at <"$work/$case.end.$w"
    err=$(cat "$work/$case.err.$w" 2>/dev/null)
    say "$case: A's writer $w: exit $st at $at ms${err:+ ($err)}"
  done
}
# judge_blocks CASE FIRST WHAT LANDS S1 FINAL: the checks on a case's blocks, from what B read
# right after its WHAT returned (S1) and once A's writers ended (FINAL). LANDS yes, a control run:
# each witness read clean right after B's WHAT, and carries A's text at the end; no: nothing of
# A's landed on a witness after B's WHAT returned. B's blocks carry B's text either way. LANDS
# over-b: as yes, on B's blocks too (A's writes went out after B's own, and overwrote them).
judge_blocks() {
  local case=$1 first=$2 what=$3 lands=$4 k
  local -a s1_blocks=() final_blocks=() judged=("${witnesses[@]}")
  IFS='|' read -r -a s1_blocks <<<"$5"
  IFS='|' read -r -a final_blocks <<<"$6"
  if [[ $lands == over-b ]]; then
    for ((k = b_first; k < b_first + b_count; k++)); do judged+=("$k"); done
    lands=yes
  fi
  for k in "${judged[@]}"; do
    if [[ $lands == yes ]]; then
      lab_expect_eq "$case: block $((first + k)) read clean right after B's $what" "${s1_blocks[k]:-}" "clean $case"
      lab_expect_eq "$case: A's write landed on block $((first + k)) after B's $what returned" \
        "${final_blocks[k]:-}" "A $case writer $k"
    else
      lab_expect_eq "$case: nothing of A's landed on block $((first + k)) after B's $what returned" \
        "${final_blocks[k]:-}" "${s1_blocks[k]:-}"
    fi
  done
  ((${#judged[@]} > ${#witnesses[@]})) && return
  for ((k = b_first; k < b_first + b_count; k++)); do
    lab_expect_eq "$case: B's text on block $((first + k))" "${final_blocks[k]:-}" "B $case"
  done
}
# final_blocks CASE FIRST: the case's blocks once A's writers ended, "|"-separated, read by B.
final_blocks() {
  read_blocks "${dev[2]}" "$2" "$work/$1.final" || lab_not_ok "$1: reading the blocks at the end failed"
  blocks "$work/$1.final"
}

# The kernel's log from line FROM on: the commands each PREEMPT AND ABORT aborted (LIO's dynamic
# debug), the iSCSI connections that failed, and the initiator's SCSI errors and recovery.
kernel_log() {
  dmesg | awk -v from="$1" 'NR > from {
    l = tolower($0)
    if (l ~ /lun_reset: (itt|preempt starting|tmr starting)|abort_task|tmr_|connection[0-9]+:|nopin|login|reinstatement|reservation conflict|timing out/)
      print "  kernel: " $0
  }'
}

# launch_writers CASE FIRST DEV: A's writers, one write of one block each from FIRST on, each
# leaving its exit status and end time in $work/CASE.end.W.
launch_writers() {
  local case=$1 first=$2 a=$3 w
  writer_pids=()
  for ((w = 0; w < writers; w++)); do
    (
      lab_write "$a" $((first + w)) "A $case writer $w" >"$work/$case.err.$w"
      echo "$? $(now_ms)" >"$work/$case.end.$w"
    ) &
    writer_pids+=($!)
  done
}
# start_writers CASE FIRST DEV [queued|started]: launch_writers; returns once all are in flight at
# the backend, with queued once all wait in DEV's map and none reached the backend (fails, saying
# so, when they do not), with started at once.
start_writers() {
  local case=$1 first=$2 a=$3 from sent=yes
  if [[ ${4:-} == started ]]; then
    launch_writers "$case" "$first" "$a"
    return 0
  fi
  if [[ ${4:-} == queued ]]; then
    launch_writers "$case" "$first" "$a"
    if ! await 200 writes_queued "$a" "$writers" || ! backend_has 0; then
      lab_not_ok "$case: A's $writers writes wait in the map: $(backend_inflight) at the backend; $(writers_seen "$a")"
      return 1
    fi
    say "$case: A's $writers writes wait in the map, none at the backend"
    return 0
  fi
  # The backend's map stays suspended until A's initiator has sent all the writes, so that they
  # reach the delay together however long each writer takes to start (a loaded host spreads the
  # starts over seconds under TCG), and each is held DELAY_MS from the resume on. Meanwhile they
  # wait in LIO, accepted and stamped with the key that held as they arrived.
  from=$(dmesg | wc -l)
  dmsetup suspend --nolockfs "$dm_name" || { lab_not_ok "$case: suspending the backend's map failed"; return 1; }
  launch_writers "$case" "$first" "$a"
  await 400 a_writes_sent "$a" "$writers" || sent=no
  dmsetup resume "$dm_name" || { lab_not_ok "$case: resuming the backend's map failed"; return 1; }
  if [[ $sent == no ]] || ! await 200 backend_has "$writers"; then
    lab_not_ok "$case: A's $writers writes in flight at the backend: $(backend_inflight) are (A's initiator sent them all: $sent); $(writers_seen "$a")"
    printf '  session %s\n' "$(grep -H . /sys/class/iscsi_session/session*/state 2>/dev/null | tr '\n' ' ')"
    printf '  %s: device state %s\n' "$a" "$(cat "/sys/block/${a#/dev/}/device/state" 2>/dev/null)"
    kernel_log "$from"
    return 1
  fi
  say "$case: A's $writers writes in flight at the backend"
}

run_case() {
  local case=$1 first=$2 a=${dev[1]} b=${dev[2]} w k pr_ms dmesg_from done0 t_b at_b s1 final
  local -a s1_blocks=()
  echo "--- $case: blocks $first-$((first + writers - 1)), writes held $delay_ms ms"
  mark_clean "$case" "$first" || return 1
  dmesg_from=$(dmesg | wc -l)
  pr "$case: A registers K1" lab_pr --out --register-ignore --param-sark="$k1" "$a" || return 1
  pr "$case: A reserves type 5 with K1" lab_pr --out --reserve --param-rk="$k1" --prout-type=5 "$a" || return 1

  done0=$(backend_done)
  start_writers "$case" "$first" "$a" || return 1
  lab_ok "$case: A's $writers writes are in flight at the backend, accepted while K1 held"

  if [[ $case == drain ]]; then
    # What blkfenced does before it re-keys a holding nexus of its own (docs/protocol.md,
    # "Re-keying a holding nexus"): wait until the kernel has no write of A's in flight on the LU.
    if ! await $((delay_ms / 50 + 1200)) a_writes_done "$a"; then
      lab_not_ok "$case: A's writes in flight did not end: $(cat "/sys/block/${a#/dev/}/inflight")"
      return 1
    fi
    say "$case: A has no write in flight any more; at the backend: $(backend_inflight) held, $(($(backend_done) - done0)) done"
    lab_expect_eq "$case: A's writes all left the backend before A re-keys" \
      "$(($(backend_done) - done0))" "$writers"
  fi

  pr "$case: A re-keys its holding nexus to K2 (REGISTER AND IGNORE EXISTING KEY)" \
    lab_pr --out --register-ignore --param-sark="$k2" "$a"
  lab_expect_read "$case: the reservation's key is now K2" "$k2 Write Exclusive, registrants only" lab_holder "$b"
  pr "$case: B registers K3" lab_pr --out --register-ignore --param-sark="$k3" "$b"
  pr "$case: B preempts and aborts K2 (type 5)" \
    lab_pr --out --preempt-abort --param-rk="$k3" --param-sark="$k2" --prout-type=5 "$b"
  t_b=$(now_ms)
  at_b=$(backend_inflight)
  b_writes "$case" "$first" preempt
  say "$case: B's PREEMPT AND ABORT returned at $t_b ms with $at_b writes held at the backend; B wrote blocks $((first + b_first))-$((first + b_first + b_count - 1))"
  s1=$(blocks "$work/$case.s1")
  say "$case: the blocks right after B's preempt: $s1"

  # A's writers end by themselves: each write completes, fails, or is retried by the initiator.
  writers_report "$case"
  say "$case: writes done at the backend in this case: $(($(backend_done) - done0)) (A's writers $writers, B's 1, the rest resent by A's initiator)"
  kernel_log "$dmesg_from"

  final=$(final_blocks "$case" "$first")
  say "$case: the blocks once A's writers ended: $final"
  if [[ $case == drain ]]; then
    IFS='|' read -r -a s1_blocks <<<"$s1"
    for k in "${witnesses[@]}"; do
      lab_expect_eq "$case: A's write was on block $((first + k)) before B's preempt" \
        "${s1_blocks[k]:-}" "A $case writer $k"
    done
  fi
  judge_blocks "$case" "$first" preempt "$([[ $case == control ]] && echo yes || echo no)" "$s1" "$final"
  if [[ $case == control ]]; then
    lab_expect_eq "$case: B's preempt returned with A's writes still held at the backend" "$at_b" "$writers"
  fi
  if [[ $case == control || $case == drain ]]; then
    for ((w = 0; w < writers; w++)); do
      lab_expect_eq "$case: A's writer $w succeeded" "$(cut -d' ' -f1 "$work/$case.end.$w" 2>/dev/null)" 0
    done
  fi
  lab_expect_read "$case: only B's key is registered" "$k3 " lab_keyset "$b"
  lab_expect_read "$case: B holds" "$k3 Write Exclusive, registrants only" lab_holder "$b"
  lab_pr --out --clear --param-rk="$k3" "$b" >/dev/null
  return 0
}

# The same with blkfenced on both nodes (tests/lab/daemon/lib.sh), resource "db" on the delayed LU
# by its sd name, PREEMPT AND ABORT: A acquires (K1), its four writes go in flight, A releases
# (the gate closes; K1 keeps the reservation) and acquires again, which re-keys the holding nexus;
# then B acquires. daemon: A's acquire says in its status that it waits for A's writes, returns
# only once they have left the backend, and nothing of A's lands after B's acquire returned.
# daemon-mutant: blkfenced built with the rekey_without_drain mutant re-keys at once, and A's
# writes land after B's acquire returned: the check sees the window when the wait is missing.
# daemon_config NODE ID DEVS [PREEMPT MODE COMMAND_TIMEOUT LEASE]: NODE's configuration on the
# paths DEVS (space-separated; PREEMPT AND ABORT, exclusive, 2 s, 3 s by default).
daemon_config() {
  local -a names
  local devices="" name
  read -r -a names <<<"$3"
  for name in "${names[@]}"; do devices+="${devices:+, }\"$name\""; done
  mkdir -p "$BF/$1/state" "$BF/$1/run"
  cat >"$BF/$1/blkfence.toml" <<TOML
cluster = "lab"
node_id = $2
state_dir = "$BF/$1/state"
run_dir = "$BF/$1/run"

[[resource]]
name = "db"
devices = [$devices]
mode = "${5:-exclusive}"
preempt = "${4:-preempt-and-abort}"
check_interval = "500ms"
lease = "${7:-3s}"
command_timeout = "${6:-2s}"
on_fenced = "none"
TOML
}

# start_daemons CASE BINARY [PREEMPT MODE COMMAND_TIMEOUT LEASE]: a fresh blkfenced on each node,
# node A's built as BINARY, resource "db" on the node's path to the delayed LU (daemon_config; A's
# on the paths a_devices names, when set).
start_daemons() {
  local case=$1 binary=$2
  shift 2
  rm -rf "$BF"
  daemon_config A 1 "${a_devices:-${dev[1]}}" "$@" && daemon_config B 2 "${dev[2]}" "$@" || return 1
  bf_start A "$binary" >"$work/start.A" 2>&1 || { lab_not_ok "$case: A's daemon starts: $(cat "$work/start.A")"; return 1; }
  bf_start B >"$work/start.B" 2>&1 || { lab_not_ok "$case: B's daemon starts: $(cat "$work/start.B")"; return 1; }
}
# stop_daemons: both daemons stopped, and the LU left with no registration for the next case.
stop_daemons() {
  bf_stop A
  bf_stop B
  lab_pr --out --register-ignore --param-sark=0x1 "${dev[2]}" >/dev/null &&
    lab_pr --out --clear --param-rk=0x1 "${dev[2]}" >/dev/null
}

# ctl_timed DESCRIPTION NODE ARGS...: blkfencectl as a check, its duration on the timeline.
ctl_timed() {
  local desc=$1 node=$2 t0=${EPOCHREALTIME/./} out rc
  shift 2
  out=$(bf_ctl "$node" "$@" 2>&1)
  rc=$?
  say "$desc: $(((${EPOCHREALTIME/./} - t0) / 1000)) ms: $out"
  if ((rc == 0)); then lab_ok "$desc"; else lab_not_ok "$desc (exit $rc): $out"; return 1; fi
}

run_daemon_case() {
  local case=$1 first=$2 binary=$BLKFENCED a=${dev[1]} b=${dev[2]} done0 waited=0 s1 final
  [[ $case == daemon-mutant ]] && binary=${BLKFENCED_MUTANT_REKEY:?BLKFENCED_MUTANT_REKEY must name the mutant blkfenced}
  echo "--- $case: blocks $first-$((first + writers - 1)), writes held $delay_ms ms, A runs ${binary##*/}"
  mark_clean "$case" "$first" || return 1
  start_daemons "$case" "$binary" || return 1
  ctl_timed "$case: A acquires" A acquire db || return 1
  done0=$(backend_done)
  start_writers "$case" "$first" "$a" || return 1
  ctl_timed "$case: A releases (its key keeps the reservation)" A release db || return 1
  # In the background, so that the status can be read meanwhile; its check is made below.
  (
    t0=${EPOCHREALTIME/./}
    bf_ctl A acquire db >"$work/$case.acquire" 2>&1
    echo "$? $(((${EPOCHREALTIME/./} - t0) / 1000))" >"$work/$case.acquire.rc"
  ) &
  local acquire_pid=$! rc ms
  if [[ $case == daemon ]]; then
    await 200 status_says_waiting && waited=1
    lab_expect_eq "$case: A's status says it waits for its writes in flight" "$waited" 1
  fi
  wait "$acquire_pid"
  read -r rc ms <"$work/$case.acquire.rc"
  say "$case: A's second acquire (re-keys its holding nexus): exit $rc after $ms ms: $(cat "$work/$case.acquire")"
  lab_expect_eq "$case: A's second acquire succeeded" "$rc" 0
  if [[ $case == daemon ]]; then
    lab_expect_eq "$case: A's writes had all left the backend when its acquire returned" \
      "$(($(backend_done) - done0))" "$writers"
  else
    lab_expect_eq "$case: A's writes were still held at the backend when its acquire returned" \
      "$(backend_inflight)" "$writers"
  fi
  ctl_timed "$case: B acquires (PREEMPT AND ABORT of A's new key)" B acquire db || return 1
  b_writes "$case" "$first" acquire
  s1=$(blocks "$work/$case.s1")
  say "$case: the blocks right after B's acquire: $s1"
  writers_report "$case"
  final=$(final_blocks "$case" "$first")
  say "$case: the blocks once A's writers ended: $final"
  judge_blocks "$case" "$first" acquire "$([[ $case == daemon-mutant ]] && echo yes || echo no)" "$s1" "$final"
  lab_expect_key "$case: B holds" "$(bf_field B db key 2>/dev/null)" lab_holder_key "$b"
  stop_daemons
  return 0
}
# A plain takeover with A's writes in flight, blkfenced on both nodes: A holds (an exclusive
# acquire, or a promote in primary mode with both nodes members first), its four writes go in
# flight at the backend, and B acquires (or promotes). B's command timeout (20 s) outlasts the
# backend's delay, since LIO's PREEMPT AND ABORT waits for the aborted writes to leave the backend.
#   takeover, promote: PREEMPT AND ABORT. B's operation returns only once none of A's writes is
#     held at the backend, and nothing of A's lands after it returned.
#   takeover-preempt, promote-preempt: the control run, preempt = "preempt". B's operation returns
#     at once with A's writes held at the backend, the witnesses read clean right after it, and A's
#     writes land afterwards: the window that PREEMPT AND ABORT closes (SPC-4 5.13.11.2.4: plain
#     PREEMPT leaves the task set alone; docs/reference/spc4-pr.md §4), so the check can fail.
run_takeover_case() {
  local case=$1 first=$2 a=${dev[1]} b=${dev[2]} mode=exclusive preempt=preempt-and-abort
  local hold=acquire take=acquire done0 done_b at_b s1 final t0
  [[ $case == promote* ]] && mode=primary hold=promote take=promote
  [[ $case == *-preempt ]] && preempt=preempt
  echo "--- $case: blocks $first-$((first + writers - 1)), writes held $delay_ms ms, $mode mode, $preempt"
  mark_clean "$case" "$first" || return 1
  start_daemons "$case" "$BLKFENCED" "$preempt" "$mode" 20s 30s || return 1
  if [[ $mode == primary ]]; then
    ctl_timed "$case: A joins as a member" A unfence db || return 1
    ctl_timed "$case: B joins as a member" B unfence db || return 1
  fi
  ctl_timed "$case: A ${hold}s" A "$hold" db || return 1
  done0=$(backend_done)
  start_writers "$case" "$first" "$a" || return 1
  t0=${EPOCHREALTIME/./}
  ctl_timed "$case: B ${take}s ($preempt of A's key)" B "$take" db || return 1
  at_b=$(backend_inflight) done_b=$(($(backend_done) - done0))
  b_writes "$case" "$first" "$take"
  s1=$(blocks "$work/$case.s1")
  say "$case: B's $take returned with $at_b of A's writes held at the backend ($done_b done); the blocks read $(((s1_read_us - t0) / 1000)) ms after B's $take began: $s1"
  writers_report "$case"
  final=$(final_blocks "$case" "$first")
  say "$case: the blocks once A's writers ended: $final"
  if [[ $preempt == preempt ]]; then
    lab_expect_eq "$case: B's $take returned with A's writes still held at the backend" "$at_b" "$writers"
  else
    lab_expect_eq "$case: B's $take returned with none of A's writes held at the backend" "$at_b" 0
  fi
  judge_blocks "$case" "$first" "$take" "$([[ $preempt == preempt ]] && echo yes || echo no)" "$s1" "$final"
  lab_expect_key "$case: B holds" "$(bf_field B db key 2>/dev/null)" lab_holder_key "$b"
  lab_expect "$case: A's daemon reports fenced" bf_await A db state fenced
  stop_daemons
  return 0
}
# Writes queued in the initiator (docs/protocol.md, "Writes queued in the initiator"), blkfenced on
# both nodes in primary mode: A writes through a dm-multipath map of its own over its path to the
# LU, with queue_if_no_path, and the map's only path failed (dmsetup message fail_path), so A's four
# writes wait in the map, none at the target. A is the primary; B promotes (PREEMPT AND ABORT of
# A's key); A's daemon sees the fence and closes its gate; A rejoins as a member (unfence: its key
# registered again); then the map's path is reinstated.
#   queued: A's daemon stops the map queueing as its gate closes (fail_if_no_path): A's writes
#     fail there, and nothing of A's lands after B's promote returned.
#   queued-mutant: A runs blkfenced built with the keep_host_queues mutant, which leaves the map
#     queueing: A's writes go out once the path is back, through a nexus registered again, and land
#     after B's promote returned, over B's own writes too, so the check can fail.
run_queued_case() {
  local case=$1 first=$2 binary=$BLKFENCED a=${dev[1]} majmin sectors mp
  [[ $case == queued-mutant ]] && binary=${BLKFENCED_MUTANT_QUEUES:?BLKFENCED_MUTANT_QUEUES must name the mutant blkfenced}
  echo "--- $case: blocks $first-$((first + writers - 1)), A writes through a queueing multipath map, A runs ${binary##*/}"
  mark_clean "$case" "$first" || return 1
  if ! { majmin=$(cat "/sys/class/block/${a#/dev/}/dev") && sectors=$(blockdev --getsz "$a") &&
    modprobe -a dm_multipath dm_round_robin &&
    dmsetup create --noudevsync "$mp_name" \
      --table "0 $sectors multipath 1 queue_if_no_path 0 1 1 round-robin 0 1 1 $majmin 1" &&
    mp=$(dm_node "$mp_name"); }; then
    lab_not_ok "$case: the multipath map over A's path"
    return 1
  fi
  writer_pids=()
  queued_steps "$case" "$first" "$binary" "$majmin" "$mp"
  stop_daemons
  # Writes a failed step left waiting in the map would keep it open.
  dmsetup message "$mp_name" 0 fail_if_no_path >/dev/null 2>&1
  ((${#writer_pids[@]} == 0)) || await 200 writers_ended "$case"
  dmsetup remove --noudevsync "$mp_name" || lab_not_ok "$case: removing the multipath map"
}
# queued_steps CASE FIRST BINARY MAJMIN MAP: run_queued_case's steps once its map MAP (/dev/dm-N)
# over A's path MAJMIN is made.
queued_steps() {
  local case=$1 first=$2 binary=$3 majmin=$4 mp=$5 b=${dev[2]} s1 final
  start_daemons "$case" "$binary" preempt-and-abort primary 20s 30s || return 1
  ctl_timed "$case: A joins as a member" A unfence db || return 1
  ctl_timed "$case: B joins as a member" B unfence db || return 1
  ctl_timed "$case: A promotes" A promote db || return 1
  lab_expect "$case: the map queues writes while it has no path" map_queues
  dmsetup message "$mp_name" 0 fail_path "$majmin" || { lab_not_ok "$case: failing the map's path"; return 1; }
  start_writers "$case" "$first" "$mp" queued || return 1
  ctl_timed "$case: B promotes (PREEMPT AND ABORT of A's key)" B promote db || return 1
  b_writes "$case" "$first" promote
  s1=$(blocks "$work/$case.s1")
  say "$case: the blocks right after B's promote: $s1"
  lab_expect "$case: A's daemon reports fenced" bf_await A db state fenced
  if [[ $case == queued ]]; then
    lab_expect "$case: A's daemon stopped the map queueing as its gate closed" \
      bf_await_log A "no longer queues writes while it has no path"
    lab_expect "$case: A's writers failed in the map" await 200 writers_ended "$case"
  else
    lab_expect "$case: A's writes are still queued in the map" writes_queued "$mp" "$writers"
  fi
  ctl_timed "$case: A rejoins as a member (its key registered again)" A unfence db || return 1
  dmsetup message "$mp_name" 0 reinstate_path "$majmin" ||
    lab_not_ok "$case: reinstating the map's path"
  writers_report "$case"
  final=$(final_blocks "$case" "$first")
  say "$case: the blocks once A's writers ended: $final"
  judge_blocks "$case" "$first" promote "$([[ $case == queued-mutant ]] && echo over-b || echo no)" "$s1" "$final"
  if [[ $case == queued ]]; then
    local w
    for ((w = 0; w < writers; w++)); do
      lab_expect_eq "$case: A's writer $w failed" "$(cut -d' ' -f1 "$work/$case.end.$w" 2>/dev/null)" 1
    done
  fi
  lab_expect_key "$case: B holds" "$(bf_field B db key 2>/dev/null)" lab_holder_key "$b"
}
# writers_seen DEV: each dd process, what its fd 1 is, its system call and where it waits, the
# writers' errors so far and the map's status: what writes_queued saw.
writers_seen() {
  local pid
  for pid in $(pgrep -x dd); do
    printf 'dd %s: fd 1 %s, syscall %s, wchan %s; ' "$pid" "$(readlink -f "/proc/$pid/fd/1" 2>/dev/null)" \
      "$(cut -d' ' -f1 "/proc/$pid/syscall" 2>/dev/null)" "$(cat "/proc/$pid/wchan" 2>/dev/null)"
  done
  printf 'DEV %s; ends: %s; errors: %s; map: %s' "$(readlink -f "$1")" "$(cat "$work"/*.end.* 2>/dev/null | tr '\n' ' ')" \
    "$(cat "$work"/*.err.* 2>/dev/null | tr '\n' ' ')" "$(dmsetup status "$mp_name" 2>&1)"
}
# dm_node NAME: /dev/dm-N of the device-mapper map NAME (made with --noudevsync, and no udev runs
# here: /dev/mapper has no link to it).
dm_node() {
  local d
  for d in /sys/block/dm-*; do
    [[ $(cat "$d/dm/name" 2>/dev/null) == "$1" ]] && { echo "/dev/${d##*/}"; return 0; }
  done
  return 1
}
# map_queues: the map's table names queue_if_no_path among its features.
map_queues() { [[ $(dmsetup table "$mp_name") == *" multipath "[1-9]*queue_if_no_path* ]]; }
# writes_queued DEV COUNT: COUNT dd processes are blocked in write(2) on DEV (their write waits in
# the map; /sys/block/dm-N/inflight reads 0 0 meanwhile: the map keeps requeueing the request, and
# a request waiting to be sent again does not count).
writes_queued() {
  local target pid nr n=0
  target=$(readlink -f "$1")
  for pid in $(pgrep -x dd); do
    [[ $(readlink -f "/proc/$pid/fd/1" 2>/dev/null) == "$target" ]] || continue
    read -r nr _ <"/proc/$pid/syscall" 2>/dev/null && [[ $nr == 1 ]] && n=$((n + 1))
  done
  ((n == $2))
}
status_says_waiting() {
  local status
  status=$(bf_ctl A status db 2>/dev/null) && [[ $status == *"waiting for this node's earlier writes"* ]]
}

# A path in recovery (docs/protocol.md, "Writes queued in the initiator"), blkfenced on both nodes
# in exclusive mode: A reaches the LU through two sessions, portal and portal2 (two I_T nexuses),
# and holds it. nftables drops every packet of the second session; A's four writes through that
# path go out into nothing, the session fails on its NOP-Out timeout and goes into recovery, its
# SCSI device is blocked, and the writes wait in A's block layer, not started (counted nowhere),
# none at the target. B acquires (PREEMPT AND ABORT of A's key); A's daemon sees the fence through
# its first path; A acquires again while the second session still recovers; then the session is
# let back.
#   recovery: A's acquire waits, its status naming the blocked path; once the session is back A's
#     writes go out through a nexus still unregistered and are refused, and only then does A
#     register: nothing of A's lands after B's acquire returned.
#   recovery-mutant: A runs blkfenced built with the rekey_without_drain mutant, which registers
#     at once: its REGISTER through the blocked path waits at the head of that queue, goes out first
#     when the session is back, and A's writes land after it, after B's acquire returned.
run_recovery_case() {
  local case=$1 first=$2 binary=$BLKFENCED a2="" hctl2="" s1 final w
  [[ $case == recovery-mutant ]] && binary=${BLKFENCED_MUTANT_REKEY:?BLKFENCED_MUTANT_REKEY must name the mutant blkfenced}
  echo "--- $case: blocks $first-$((first + writers - 1)), A writes through a path in recovery, A runs ${binary##*/}"
  mark_clean "$case" "$first" || return 1
  if ! login_second || ! await 600 second_dev; then
    lab_not_ok "$case: A's second session to the LU ($portal2)"
    logout_second
    return 1
  fi
  a2=$second hctl2=$second_hctl
  lab_pr -k "$a2" >/dev/null  # the fresh nexus's unit attention
  say "$case: A's second path $a2 ($hctl2) through $portal2"
  recovery_steps "$case" "$first" "$binary" "$a2" "$hctl2"
  nft delete table inet bf_rekey >/dev/null 2>&1
  ((${#writer_pids[@]} == 0)) || await 1200 writers_ended "$case"
  stop_daemons
  logout_second
}
# recovery_steps CASE FIRST BINARY DEV HCTL: run_recovery_case's steps once A's second path DEV
# (H:C:T:L HCTL) is there.
recovery_steps() {
  local case=$1 first=$2 binary=$3 a2=$4 hctl2=$5 b=${dev[2]} s1 final w
  # The LU by its WWN, so that A's daemon finds both paths.
  a_devices=$(cat "/sys/block/${a2#/dev/}/device/wwid") || return 1
  start_daemons "$case" "$binary" preempt-and-abort exclusive 2s 5s || { a_devices=""; return 1; }
  a_devices=""
  ctl_timed "$case: A acquires (both paths)" A acquire db || return 1
  lab_expect "$case: the second session's packets are dropped" block_portal2
  start_writers "$case" "$first" "$a2" started || return 1
  if ! await 1200 writes_unstarted "$a2" "$hctl2"; then
    lab_not_ok "$case: A's writes wait in the blocked device: state $(cat "/sys/class/scsi_device/$hctl2/device/state"), inflight $(cat "/sys/block/${a2#/dev/}/inflight"), $(backend_inflight) at the backend"
    return 1
  fi
  say "$case: A's $writers writes wait in its blocked device $hctl2, counted nowhere, none at the backend"
  ctl_timed "$case: B acquires (PREEMPT AND ABORT of A's key)" B acquire db || return 1
  b_writes "$case" "$first" acquire
  s1=$(blocks "$work/$case.s1")
  say "$case: the blocks right after B's acquire: $s1"
  lab_expect "$case: A's daemon reports fenced" bf_await A db state fenced
  # In the background, so that the status can be read meanwhile; its check is made below.
  (
    t0=${EPOCHREALTIME/./}
    bf_ctl A acquire db >"$work/$case.acquire" 2>&1
    echo "$? $(((${EPOCHREALTIME/./} - t0) / 1000))" >"$work/$case.acquire.rc"
  ) &
  if [[ $case == recovery ]]; then
    lab_expect "$case: A's acquire waits, its status naming the blocked path" \
      await 400 status_says "may hold writes that no count shows: its SCSI device $hctl2 is blocked"
    lab_expect "$case: ... and A sent no REGISTER meanwhile (A's writes still wait)" \
      writes_unstarted "$a2" "$hctl2"
  else
    # The mutant's REGISTER through the blocked path waits in that queue: A's acquire fails on it
    # (its command timeout) or goes on through the first path; either way it has been sent.
    lab_expect "$case: A's acquire ends" await 1200 test -s "$work/$case.acquire.rc"
  fi
  lab_expect "$case: the second session's packets pass again" nft delete table inet bf_rekey
  lab_expect "$case: the second session logs in again" await 1200 device_state "$hctl2" running
  writers_report "$case"
  lab_expect "$case: A's acquire ends" await 1800 test -s "$work/$case.acquire.rc"
  say "$case: A's acquire: exit $(cut -d' ' -f1 "$work/$case.acquire.rc") after $(cut -d' ' -f2 "$work/$case.acquire.rc") ms: $(cat "$work/$case.acquire")"
  final=$(final_blocks "$case" "$first")
  say "$case: the blocks once A's writers ended: $final"
  if [[ $case == recovery ]]; then
    lab_expect_eq "$case: A's acquire succeeded" "$(cut -d' ' -f1 "$work/$case.acquire.rc")" 0
    judge_blocks "$case" "$first" acquire no "$s1" "$final"
    for ((w = 0; w < writers; w++)); do
      lab_expect_eq "$case: A's writer $w was refused" "$(cut -d' ' -f1 "$work/$case.end.$w" 2>/dev/null)" 1
    done
  else
    judge_blocks "$case" "$first" acquire over-b "$s1" "$final"
  fi
}
# login_second: node A's session to the LU through portal2, with NOP-Outs every second that time
# out after 2 s (so that a dropped session fails within seconds) and a replacement_timeout of 120
# s (its devices stay blocked, their commands held, for the whole case).
login_second() {
  local n
  iscsiadm -m node -o new -T "$lab_iscsi_target" -p "$portal2:3260,3" -I lab-a >/dev/null || return 1
  for n in node.conn[0].timeo.noop_out_interval=1 node.conn[0].timeo.noop_out_timeout=2 \
    node.session.timeo.replacement_timeout=120; do
    iscsiadm -m node -T "$lab_iscsi_target" -p "$portal2:3260" -I lab-a -o update \
      -n "${n%%=*}" -v "${n#*=}" >/dev/null || return 1
  done
  iscsiadm -m node -T "$lab_iscsi_target" -p "$portal2:3260" -I lab-a --login >/dev/null
}
# second_dev: sets second (/dev/sdX) and second_hctl once A's session through portal2 has its disk.
second_dev() {
  local s c b
  for s in /sys/class/iscsi_session/session*; do
    [[ $(cat "$s/initiatorname") == "$(lab_iscsi_initiator 1)" ]] || continue
    for c in "$s"/device/connection*/iscsi_connection/connection*; do
      [[ $(cat "$c/persistent_address" 2>/dev/null) == "$portal2" ]] || continue 2
    done
    for b in "$s"/device/target*/*/block/*; do
      [[ -e $b ]] || continue
      second=/dev/${b##*/}
      second_hctl=$(basename "$(dirname "$(dirname "$b")")")
      return 0
    done
  done
  return 1
}
# block_portal2: nftables drops every packet to and from portal2 (the session hangs: nothing tells
# the host, which finds out when its NOP-Outs time out, and cannot log in again meanwhile).
block_portal2() {
  nft -f - <<NFT
table inet bf_rekey {
  chain input {
    type filter hook input priority 0; policy accept;
    ip daddr $portal2 tcp dport 3260 drop
    ip saddr $portal2 tcp sport 3260 drop
  }
}
NFT
}
device_state() { [[ $(cat "/sys/class/scsi_device/$1/device/state" 2>/dev/null) == "$2" ]]; }
# writes_unstarted DEV HCTL: the writers' writes wait in DEV's block layer: its device blocked,
# nothing counted in flight, none at the backend.
writes_unstarted() {
  device_state "$2" blocked && [[ $(cat "/sys/block/${1#/dev/}/inflight") == *" 0" ]] && backend_has 0
}
status_says() {
  local status
  status=$(bf_ctl A status db 2>/dev/null) && [[ $status == *"$1"* ]]
}

step "the delayed LU is built (dm-delay, writes held ${delay_ms} ms)" make_lu
step "node A logs in to portal group 3" login a
step "node B logs in to portal group 3" login b
step "both nodes see the delayed LU" await 600 both_devs
say "delayed LU: $dm over $loopdev; A ${dev[1]} (host ${host[1]}), B ${dev[2]} (host ${host[2]}); SCSI command timeout $(cat "/sys/block/${dev[1]#/dev/}/device/timeout") s, TAS $(cat "$backstore/attrib/emulate_tas")"
# The first commands on a fresh nexus get unit attentions (lab_pr retries them).
lab_pr -k "${dev[1]}" >/dev/null && lab_pr -k "${dev[2]}" >/dev/null
for ddebug in /proc/dynamic_debug/control /sys/kernel/debug/dynamic_debug/control ""; do
  [[ -z $ddebug || -w $ddebug ]] && break
done
[[ -n $ddebug ]] && echo 'module target_core_mod file target_core_tmr.c +p' >"$ddebug"

first=0
for c in "${cases[@]}"; do
  case $c in
    control | drain) run_case "$c" "$first" ;;
    daemon | daemon-mutant) run_daemon_case "$c" "$first" ;;
    takeover | takeover-preempt | promote | promote-preempt) run_takeover_case "$c" "$first" ;;
    queued | queued-mutant) run_queued_case "$c" "$first" ;;
    recovery | recovery-mutant) run_recovery_case "$c" "$first" ;;
    *) lab_not_ok "unknown case '$c' (control, drain, daemon, daemon-mutant, takeover, takeover-preempt, promote, promote-preempt, queued, queued-mutant, recovery, recovery-mutant, notas)" ;;
  esac
  first=$((first + 16))
done
lab_done

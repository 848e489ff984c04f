# The lab job's steps inside the guest, shared by both ways the guest boots (sourced; bash):
# guest/stage2 runs them itself as PID 1, and under `tests/lab/run --init systemd` the units that
# guest/systemd.sh generates run them (guest/systemd-step), with systemd as PID 1.
#
#   lab_job_topology   loads LIO and the initiator side, builds the topology job.env asks for
#                      (topology.sh) and writes the node -> LU -> device map
#   lab_job_run        runs the test command under the deadline watchdog and writes its status
#   lab_job_power_off  writes the kernel log (and the journal, under systemd) and powers off
#   lab_job_fail       records a set-up failure for the host (setup-error) and powers off
#
# Everything the host reads is written to /lab/out: times, setup.log, test.log, status, watchdog,
# dmesg.log, and at a deadline kept-logs/ (the daemons' logs that checks named with
# lab_keep_logs). The power-off is sysrq o in both boots: it does not depend on the guest's
# services, so a wedged service manager cannot keep the guest up past the runner's deadline.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8
lab_out=/lab/out
# shellcheck source=/dev/null
. "$lab_out/job.env"
# shellcheck source=tests/lab/guest/topology.sh
. "$LAB_REPO/tests/lab/guest/topology.sh"

# lab_job_mark NAME: the guest's uptime at a step, for the runner's timing line.
lab_job_mark() { printf '%s %s\n' "$1" "$(cut -d' ' -f1 /proc/uptime)" >>"$lab_out/times"; }

lab_job_power_off() {
  dmesg >"$lab_out/dmesg.log" 2>&1
  if [[ -d /run/systemd/system ]]; then
    journalctl -b -o short-monotonic --no-pager >"$lab_out/journal.log" 2>&1
  fi
  sync
  echo o >/proc/sysrq-trigger
  sleep 60  # sysrq o does not return; PID 1 must not exit meanwhile (that would panic)
}

lab_job_fail() {
  echo "lab: error: $*" | tee -a "$lab_out/setup.log" >/dev/console
  echo "setup failed: $*" >"$lab_out/setup-error"
  lab_job_power_off
}

lab_job_topology() {
  {
    lab_enable_builtins && lab_load_modules &&
      lab_create_backstores &&
      "lab_create_$LAB_FABRIC" &&
      lab_await_devices &&
      lab_write_map "$lab_out/map.tsv" "$lab_out/map.json"
  } >>"$lab_out/setup.log" 2>&1 || lab_job_fail "building the $LAB_FABRIC topology (see setup.log)"
  lab_job_mark topology
}

# The environment a test command gets (tests/lab/README.md, "The map"). The clone is made 0700 in
# the guest (on the overlay; the host's tree is untouched), as a clone under /root or in a
# `mktemp -d` directory is: every check then proves that what it runs as another user (Patroni
# and PostgreSQL as postgres) neither starts in the clone nor runs anything from it.
lab_job_env() {
  export BLKFENCE_LAB_MAP=$lab_out/map.tsv BLKFENCE_LAB_MAP_JSON=$lab_out/map.json
  export BLKFENCE_LAB_OUT=$lab_out BLKFENCE_LAB_FABRIC=$LAB_FABRIC BLKFENCE_LAB_REPO=$LAB_REPO
  export BLKFENCE_LAB_BOOT=${LAB_BOOT:-1}
  # Where lab_keep_logs (tests/lab/lib/guest.sh) names the directories of logs to keep.
  export BLKFENCE_LAB_KEEP_LOGS=/tmp/lab-keep-logs
  chmod 0700 "$LAB_REPO" || lab_job_fail "making $LAB_REPO 0700 in the guest"
  cd "$LAB_REPO" || lab_job_fail "no $LAB_REPO in the guest"
}

# lab_job_keep_logs: the files named *.log or log under each directory a check registered with
# lab_keep_logs (tests/lab/lib/guest.sh), copied to kept-logs/NAME/ in the results. Prints what it
# kept. lab_job_keep_logs_bounded runs it for at most 30 s: a copy stuck on a wedged file system
# (a process in state D, which no signal ends) must not keep the guest up.
lab_job_keep_logs() {
  local dir name
  [[ -f $BLKFENCE_LAB_KEEP_LOGS ]] || return 0
  while IFS=$'\t' read -r dir name; do
    [[ -d $dir ]] || continue
    mkdir -p "$lab_out/kept-logs/$name" &&
      (cd "$dir" && find . -type f \( -name '*.log' -o -name log \) \
        -exec cp --parents -t "$lab_out/kept-logs/$name" {} +)
    # No empty directory where nothing matched (the runner lists what is there).
    rmdir "$lab_out/kept-logs/$name" "$lab_out/kept-logs" 2>/dev/null
  done <"$BLKFENCE_LAB_KEEP_LOGS"
  (cd "$lab_out" && find kept-logs -type f 2>/dev/null | sort | tr '\n' ' ')
}

lab_job_keep_logs_bounded() {
  local kept=/tmp/lab-kept-logs try
  lab_job_keep_logs >"$kept" 2>&1 &
  for ((try = 0; try < 300; try++)); do
    if ! kill -0 $! 2>/dev/null; then
      echo "lab: watchdog: the daemons' logs kept: $(cat "$kept")"
      return 0
    fi
    sleep 0.1
  done
  echo "lab: watchdog: copying the daemons' logs took over 30 s; kept so far: $(cd "$lab_out" && find kept-logs -type f 2>/dev/null | sort | tr '\n' ' ')"
}

# lab_job_run: the test command, its output in test.log and its exit status in status; a command
# still running at LAB_DEADLINE_S gets its blocked tasks dumped and the guest powered off.
lab_job_run() {
  lab_job_env
  (
    sleep "$LAB_DEADLINE_S"
    {
      echo "lab: watchdog: the test ran past its deadline of ${LAB_DEADLINE_S}s; dumping blocked tasks, keeping the daemons' logs and powering off"
      echo w >/proc/sysrq-trigger
      lab_job_keep_logs_bounded
    } | tee -a "$lab_out/test.log" >/dev/console
    echo "$LAB_DEADLINE_S" >"$lab_out/watchdog"
    lab_job_power_off
  ) &
  eval "set -- $LAB_CMD"
  lab_job_mark test-start
  "$@" >>"$lab_out/test.log" 2>&1 </dev/null
  echo $? >"$lab_out/status"
  lab_job_mark test-end
}

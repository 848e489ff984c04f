#!/bin/bash
# Reproduces the PREEMPT AND ABORT deadlock of LIO over tcm_loop on 6.1 (docs/design.md §7): the PR OUT
# runs inside the device's submission work item and core_tmr_drain_state_list() flushes that same
# work item, so sg_persist never returns. Used by watchdog_selftest to prove that the lab's watchdog
# turns a hung target into a failed test with a blocked-task dump; it exits 0 only if the preempt
# returns, which means the deadlock is gone.
set -u
. "$BLKFENCE_LAB_REPO/tests/lab/lib/guest.sh"
a=$(lab_dev A 0) && b=$(lab_dev B 0) || exit 1
lab_pr --out --register-ignore --param-sark=0x1 "$a" &&
  lab_pr --out --register-ignore --param-sark=0x2 "$b" &&
  lab_pr --out --reserve --param-rk=0x1 --prout-type=5 "$a" || exit 1
lab_log "B issues PREEMPT AND ABORT over tcm_loop"
sg_persist -n --out --preempt-abort --param-rk=0x2 --param-sark=0x1 --prout-type=5 "$b"
lab_log "PREEMPT AND ABORT returned (status $?): the tcm_loop deadlock did not happen"

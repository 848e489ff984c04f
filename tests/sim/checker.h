// The safety properties of docs/protocol.md (S1–S5), judged on the record of one simulated run
// (tests/sim). The checker sees only what history.h records: the target's PR OUT and write
// history, each node's commands as submitted and reaped, the driver's calls and the observers'
// gates and events. Each property is stated precisely in checker.cc, above its check. Pure.
#pragma once

#include <string>
#include <vector>

#include "history.h"

namespace blkfence::sim {

struct Violation {
  std::string property;            // "S1" ... "S5", "L1", or "checker" (the record is inconsistent)
  std::string what;                // one sentence
  std::vector<std::string> lines;  // the history lines that show it
};

// The violations of the run.
std::vector<Violation> check(const Run& run);

// Under plain PREEMPT (Run::preempt_abort false, Run::strict_s1 false): the landings S1 excuses
// because the target accepted the write before the PREEMPT and executed it after (PREEMPT leaves
// the task set alone, SPC-4 5.13.11.2.4), one per write, as "S1" would report them. S1 as
// docs/protocol.md states it holds only with PREEMPT AND ABORT; these are what plain PREEMPT
// gives up. Empty under PREEMPT AND ABORT and with strict_s1 (check() reports them then).
std::vector<Violation> held_across_plain_preempt(const Run& run);

// "12.345678s"
std::string format_time(Time time);
// "0x6c9d000100000007 (n1 e7)"
std::string format_key(std::uint64_t key);
std::string describe(const Run& run, const Command& command, bool completion);
std::string describe(const Entry& entry);
std::string describe(const Run& run, const transport::PrOutRecord& record);
std::string describe(const Run& run, const transport::WriteRecord& record);
std::string describe(const WriteIssue& write);
// Every line of the run in time order: trace, commands, the target's PR OUTs and writes.
std::vector<std::string> timeline(const Run& run);

}  // namespace blkfence::sim

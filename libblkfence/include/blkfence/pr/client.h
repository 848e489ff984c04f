// The persistent reservation client: typed operations on logical units across their paths, run as
// one concurrent batch over many LUs, with the unit-attention and retry policy (pr layer).
//
// Every command of a batch goes to the transport at once; retries are resubmitted as their
// completions come back, so a batch over 64 LUs costs about one round trip, not 64. The policy
// (kernel-interfaces.md §6.4): UNIT ATTENTION is retried at once (a command that got one did not
// execute); NOT READY becoming ready / in progress / transitioning, BUSY, TASK SET FULL and TASK
// ABORTED are retried after a back-off; RESERVATION CONFLICT is never retried; any other NOT READY
// (LIO answers some PR OUTs with 08/00 after changing state) and every timeout end the command, so
// that the caller re-reads the state before deciding anything (DESIGN.md §4, S4). Reads fail over
// to the LU's next path on a transport error; PR OUT never does, since it may have executed.
// Every attempt is recorded in the result.
//
// A Client borrows its Transport and is used from one thread. Blocking: run() waits for the batch.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/sense.h"
#include "blkfence/error.h"
#include "blkfence/pr/discovery.h"
#include "blkfence/transport/transport.h"

namespace blkfence::pr {

struct RetryPolicy {
  int unit_attention_max = 5;  // libmpathpersist retries 5 times too
  int not_ready_max = 5;       // NOT READY 04/01, 04/07, 04/0A
  int busy_max = 5;            // BUSY, TASK SET FULL, TASK ABORTED, ABORTED COMMAND
  std::chrono::milliseconds backoff_first{10};
  std::chrono::milliseconds backoff_max{500};
  std::chrono::milliseconds command_timeout{10'000};  // per attempt; then kIndeterminate
};

// One try of one command on one path.
struct Attempt {
  std::string device;
  transport::Outcome outcome = transport::Outcome::kGood;
  std::optional<codec::Sense> sense;  // with kCheckCondition
  std::chrono::nanoseconds latency{0};
};

// An operation on one LU: its value or error, and every attempt on every path it touched.
template <class T>
struct LuResult {
  Result<T> value;
  std::vector<Attempt> attempts;
};

struct Nothing {};

class Client {
 public:
  Client(transport::Transport& transport, RetryPolicy policy = {});

  // PR IN on one path of each LU (the next path on a transport error).
  std::vector<LuResult<codec::ReadKeys>> read_keys(const std::vector<LogicalUnit>& lus);
  std::vector<LuResult<codec::ReadReservation>> read_reservation(
      const std::vector<LogicalUnit>& lus);
  std::vector<LuResult<codec::Capabilities>> report_capabilities(
      const std::vector<LogicalUnit>& lus);
  std::vector<LuResult<codec::FullStatus>> read_full_status(const std::vector<LogicalUnit>& lus);

  // REGISTER AND IGNORE EXISTING KEY with key on every path of each LU (each path is its own I_T
  // nexus); key 0 unregisters. A LU succeeds only when every one of its paths did.
  std::vector<LuResult<Nothing>> register_and_ignore(const std::vector<LogicalUnit>& lus,
                                                     std::uint64_t key, bool aptpl = false);
  // REGISTER (key change) with the nexus's current key on every path; new_key 0 unregisters.
  std::vector<LuResult<Nothing>> register_key(const std::vector<LogicalUnit>& lus,
                                              std::uint64_t key, std::uint64_t new_key,
                                              bool aptpl = false);
  // The rest go to the first path of each LU.
  std::vector<LuResult<Nothing>> reserve(const std::vector<LogicalUnit>& lus, std::uint64_t key,
                                         codec::PrType type);
  std::vector<LuResult<Nothing>> release(const std::vector<LogicalUnit>& lus, std::uint64_t key,
                                         codec::PrType type);
  std::vector<LuResult<Nothing>> clear(const std::vector<LogicalUnit>& lus, std::uint64_t key);
  std::vector<LuResult<Nothing>> preempt(const std::vector<LogicalUnit>& lus, std::uint64_t key,
                                         std::uint64_t victim_key, codec::PrType type, bool abort);

  // The engine under the typed operations: each request names the devices to try in order (reads
  // move to the next on a transport error), and its command. Returns the data-in of the attempt
  // that succeeded, or the error of the last one.
  struct Request {
    std::vector<std::string> devices;
    transport::Command command;
    bool is_read = false;  // may fail over to the next device
    std::string what;      // "READ KEYS", for messages
  };
  struct Response {
    Result<std::vector<std::uint8_t>> data;
    std::vector<Attempt> attempts;
  };
  std::vector<Response> run(std::vector<Request> requests);

 private:
  Result<transport::PathId> path_for(const std::string& device);

  transport::Transport& transport_;
  RetryPolicy policy_;
  std::map<std::string, transport::PathId> paths_;
};

// The device a path is driven through: its sg node when it has one (io_uring needs it), else sd.
std::string command_device(const Path& path);

// One line about an attempt, for --verbose and logs: "/dev/sg1: CHECK CONDITION, UNIT ATTENTION
// 2a/05 (retried)".
std::string describe(const Attempt& attempt);

}  // namespace blkfence::pr

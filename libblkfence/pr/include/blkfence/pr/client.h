// The persistent reservation client: typed operations on logical units across their paths, run as
// one concurrent batch over many LUs, with the unit-attention and retry policy (pr layer).
//
// Every command of a batch goes to the transport at once; retries are resubmitted as their
// completions come back, so a batch over 64 LUs costs about one round trip, not 64. The policy
// (docs/reference/spc4-pr.md §8): UNIT ATTENTION is retried at once (a command that got one did not
// execute); NOT READY becoming ready / in progress / transitioning, BUSY, TASK SET FULL and TASK
// ABORTED are retried after a back-off; RESERVATION CONFLICT is never retried; any other NOT READY
// (LIO answers some PR OUTs with 08/00 after changing state) and every timeout end the command, so
// that the caller re-reads the state before deciding anything (docs/protocol.md, S4). Reads fail
// over to the LU's next path on a transport error or a timeout, starting on the path that last
// answered (engine.h); PR OUT never does, since it may have executed.
// Every attempt is recorded in the result.
//
// A Client borrows its Transport and is used from one thread. Blocking: run() waits for the batch
// (blkfenced drives the same Engine from its event loop instead).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/codec/prin.h"
#include "blkfence/codec/prout.h"
#include "blkfence/codec/sense.h"
#include "blkfence/error.h"
#include "blkfence/pr/discovery.h"
#include "blkfence/pr/engine.h"
#include "blkfence/transport/transport.h"

namespace blkfence::pr {

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

  // PR IN on one path of each LU (the next path on a transport error or a timeout).
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

  // The engine under the typed operations, run to completion: returns when every request has
  // its answer. Responses come in the order of the requests.
  using Request = pr::Request;
  using Response = pr::Response;
  std::vector<Response> run(std::vector<Request> requests);

  // Engine::check_identity_with().
  void check_identity_with(Engine::IdentityCheck check) {
    engine_.check_identity_with(std::move(check));
  }

 private:
  Engine engine_;
};

// The requests behind the typed operations, for callers that drive an Engine themselves.
Request read_keys_request(const LogicalUnit& lu);
Request read_reservation_request(const LogicalUnit& lu);
Request report_capabilities_request(const LogicalUnit& lu);
Request read_full_status_request(const LogicalUnit& lu);
// One PR OUT on every path of the LU (each path is its own I_T nexus), or on its first path.
std::vector<Request> prout_every_path(const LogicalUnit& lu, const codec::PrOutCommand& prout,
                                      const std::string& what);
Request prout_first_path(const LogicalUnit& lu, const codec::PrOutCommand& prout,
                         const std::string& what);

// The device a path is driven through: its sg node when it has one (io_uring needs it), else sd.
std::string command_device(const Path& path);

// One line about an attempt, for --verbose and logs: "/dev/sg1: CHECK CONDITION, UNIT ATTENTION
// 2a/05 (retried)".
std::string describe(const Attempt& attempt);

}  // namespace blkfence::pr

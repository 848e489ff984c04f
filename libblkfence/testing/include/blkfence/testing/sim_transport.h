// A Transport over a SimTarget, with simulated latency and injected faults (transport layer, tests
// and simulation).
//
// Paths are opened by the device names the test mapped with SimTarget::add_path(); any other name
// fails as open(2) would, with ENOENT. Each command travels on the target's SimClock: it reaches
// the target after half its latency, is checked and executed there (or held, see Fault), and its
// answer comes back after the other half. Which faults hit a command is decided when it is
// submitted, by a FaultHook that may draw from the transport's std::mt19937_64, seeded from
// SimTransportOptions::seed: the same seed, hook and calls replay the same run, history included.
//
// The Transport contract holds whatever the faults: every submitted command completes exactly
// once, with the first answer that gets back before its deadline (Command::timeout plus
// deadline_grace) or as kIndeterminate at that deadline, and completions come in the order the
// answers arrive. A command that timed out may still execute on the target later (docs/protocol.md,
// S4). reap() does not sleep: it advances the simulated clock, running every simulated event (of
// all transports on that clock) in time order, until a completion is ready or the wait has passed.
//
// Not thread-safe; reap() must not be called from inside a clock event. The target and its clock
// must outlive the transport; events still queued when the transport goes away do nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "blkfence/error.h"
#include "blkfence/testing/sim_clock.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/transport/transport.h"

namespace blkfence::transport {

// What happens to one command on its way. All delays add to the command's base latency.
struct Fault {
  std::chrono::nanoseconds request_delay{0};   // reaches the target this much later
  std::chrono::nanoseconds response_delay{0};  // its answer comes back this much later
  // Held in the target after passing its checks, then takes effect: PREEMPT AND ABORT may abort
  // it meanwhile, a plain PREEMPT lets it land (SimTarget::submit()).
  std::chrono::nanoseconds execute_delay{0};
  bool drop_request = false;   // lost on the way: never executes
  bool drop_response = false;  // executes, but the answer is lost
  // The target receives the command this many more times (a retransmission), each
  // duplicate_interval after the one before, and executes every copy; the caller gets one
  // completion, the first answer back.
  std::uint32_t duplicates = 0;
  std::chrono::nanoseconds duplicate_interval{std::chrono::milliseconds(1)};
  // The host reports DID_NO_CONNECT after the base latency (kTransportError); never sent.
  bool transport_error = false;
  // The host refuses the command with this errno before sending it (kOsError after the base
  // latency), as sg.c answers every command on an fd whose device was removed with ENODEV.
  int os_errno = 0;
  // Established on the command's (LU, nexus) just before it arrives, so the command gets it and
  // does not execute (unless it is INQUIRY, REPORT LUNS or REQUEST SENSE).
  std::optional<UnitAttention> unit_attention;
};

struct FaultContext {
  std::uint64_t sequence;  // commands this transport accepted before this one
  PathId path;
  LuId lu;
  NexusId nexus;
  const Command& command;
  SimTime now;
  std::mt19937_64& rng;  // the transport's: draw from it, never from anything global
};

using FaultHook = std::function<Fault(const FaultContext&)>;

// Independent faults at fixed probabilities, each drawn from the context's rng with the engine's
// raw output only (its sequence is fixed by the standard, unlike the distributions'), so a seed
// replays the same faults with any standard library. Delays are uniform in [0, delay_max].
struct RandomFaults {
  double drop_request = 0;
  double drop_response = 0;
  double delay_response = 0;
  double execute_late = 0;
  double duplicate = 0;
  double unit_attention = 0;  // 29/07 I_T NEXUS LOSS OCCURRED
  std::chrono::nanoseconds delay_max{std::chrono::seconds(30)};
};
FaultHook random_faults(RandomFaults rates);

// How the transport reaches a LU, changed at any time by set_link().
enum class LinkState : std::uint8_t {
  kUp,
  // Commands complete with DID_NO_CONNECT after their base latency (kTransportError), and answers
  // on their way back are lost.
  kNoConnect,
  // Commands and answers vanish: everything in flight ends as kIndeterminate at its deadline.
  kNoAnswer,
};

// The host's block-layer queues in front of its paths, shared by every transport of one host (its
// daemon's and its writer's), so that a path whose SCSI device is blocked holds the commands of
// both. A path in recovery (an iSCSI session re-logging in, an FC remote port waiting out its
// dev_loss_tmo) sends nothing: each command for it waits in the host, started nowhere and counted
// in no in-flight count, its deadline running, until the path comes back and the queue goes out
// in order, or the session is torn down and every waiting command fails unsent. Passthrough
// commands (sg's default, without SG_FLAG_Q_AT_TAIL) are queued at the head, ahead of the writes
// already waiting; file system and O_DIRECT I/O at the tail (SimTransportOptions::queue_at_head).
class SimHostQueues {
 public:
  // The nexus's path goes into recovery: commands for it wait from now on.
  void hold(NexusId nexus);
  // Its recovery ends: recovered, the waiting commands go out in queue order (and reach the target
  // as any command does, even those of a transport that is gone: the kernel sends them anyway);
  // not, each fails unsent (DID_TRANSPORT_FAILFAST).
  void release(NexusId nexus, bool recovered);
  bool held(NexusId nexus) const { return held_.contains(nexus); }
  std::size_t waiting(NexusId nexus) const;

  // For SimTransport: queues send, called once with the recovery's end.
  void enqueue(NexusId nexus, bool at_head, std::function<void(bool recovered)> send);

 private:
  std::set<NexusId> held_;
  std::map<NexusId, std::deque<std::function<void(bool recovered)>>> queues_;
};

struct SimTransportOptions {
  std::uint64_t seed = 1;
  // Each command's base latency, uniform in [latency_min, latency_max], half each way.
  std::chrono::nanoseconds latency_min{std::chrono::microseconds(100)};
  std::chrono::nanoseconds latency_max{std::chrono::microseconds(500)};
  std::chrono::milliseconds deadline_grace{0};
  FaultHook fault{};  // empty: no faults
  // The host's queues this transport's commands pass (null: no path is ever held), and where its
  // commands wait in them.
  std::shared_ptr<SimHostQueues> host_queues{};
  bool queue_at_head = false;
};

class SimTransport final : public Transport {
 public:
  // Fails only when the eventfd behind poll_fd() cannot be created.
  [[nodiscard]] static Result<std::unique_ptr<SimTransport>> make(SimTarget& target,
                                                                  SimTransportOptions options = {});
  ~SimTransport() override;

  [[nodiscard]] Result<PathId> open_path(const std::string& device) override;
  // Everything in flight on the path completes at once as kIndeterminate; it may still execute.
  void close_path(PathId path) override;
  // A made-up node: character major 0, the minor the LuId the path was opened on.
  std::optional<DeviceNumber> device_of(PathId path) const override;
  [[nodiscard]] Result<void> submit(PathId path, Command command) override;
  [[nodiscard]] Result<std::size_t> reap(std::chrono::milliseconds wait,
                                         std::vector<Completion>& out) override;
  std::size_t in_flight() const override;
  // Commands reported (kIndeterminate, or answered while a duplicate is still out) with a copy
  // still on its way to the target or held in its task set, which may still execute; a copy lost
  // on the way, refused, executed or aborted has come back.
  std::optional<std::size_t> unreturned() const override;
  // Readable while completions are ready at the current simulated time.
  int poll_fd() const override;
  std::string_view name() const override { return "sim"; }

  // Paths open now, and paths ever opened (each open_path() that succeeded).
  std::size_t open_paths() const;
  std::size_t opened_paths() const;

  void set_link(LuId lu, LinkState state);
  SimTarget& target() const;

 private:
  struct Core;
  explicit SimTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  std::shared_ptr<Core> core_;  // events and the target hold weak references to it
};

}  // namespace blkfence::transport

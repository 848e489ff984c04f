// SimTransport: commands carried to a SimTarget on simulated time (transport layer). Not
// thread-safe, like SimTransport.
//
// The transport's state lives in a Core that clock events and the target's answer callbacks reach
// through weak pointers, so that anything still scheduled when the transport is destroyed does
// nothing. A command is pending from submit() until it is reported; every later event for it (a
// late or duplicate answer, its deadline) finds it gone and is dropped, which is what makes each
// command complete exactly once. Commands are checked and answers classified by the same code as
// the real transports (sg.h: check_command(), classify()).
#include "blkfence/testing/sim_transport.h"

#include <algorithm>
#include <cerrno>
#include <map>

#include <sys/eventfd.h>

#include "blkfence/assert.h"
#include "blkfence/unique_fd.h"

#include "sg.h"

namespace blkfence::transport {
namespace {

// include/scsi/scsi_status.h: DID_NO_CONNECT, the command was never dispatched;
// DID_TRANSPORT_FAILFAST, the path's session was torn down with the command not yet sent.
constexpr std::uint16_t kDidNoConnect = 0x01;
constexpr std::uint16_t kDidTransportFailfast = 0x0f;

// A uniform draw in [0, max] from the engine's raw output.
std::chrono::nanoseconds uniform(std::mt19937_64& rng, std::chrono::nanoseconds max) {
  if (max.count() <= 0) {
    return std::chrono::nanoseconds(0);
  }
  const auto span = static_cast<std::uint64_t>(max.count());
  if (span == UINT64_MAX) {
    return std::chrono::nanoseconds(static_cast<std::int64_t>(rng() >> 1U));
  }
  return std::chrono::nanoseconds(static_cast<std::int64_t>(rng() % (span + 1)));
}

// True with probability p, from the top 53 bits of one draw.
bool chance(std::mt19937_64& rng, double p) {
  constexpr double kTwoToMinus53 = 1.0 / 9007199254740992.0;
  return static_cast<double>(rng() >> 11U) * kTwoToMinus53 < p;
}

}  // namespace

void SimHostQueues::hold(NexusId nexus) {
  held_.insert(nexus);
}

void SimHostQueues::release(NexusId nexus, bool recovered) {
  held_.erase(nexus);
  const auto it = queues_.find(nexus);
  if (it == queues_.end()) {
    return;
  }
  const auto waiting = std::move(it->second);
  queues_.erase(it);
  for (const auto& send : waiting) {
    send(recovered);
  }
}

std::size_t SimHostQueues::waiting(NexusId nexus) const {
  const auto it = queues_.find(nexus);
  return it == queues_.end() ? 0 : it->second.size();
}

void SimHostQueues::enqueue(NexusId nexus, bool at_head, std::function<void(bool)> send) {
  BLKFENCE_ASSERT(held(nexus));
  auto& queue = queues_[nexus];
  if (at_head) {
    queue.push_front(std::move(send));
  } else {
    queue.push_back(std::move(send));
  }
}

FaultHook random_faults(RandomFaults rates) {
  return [rates](const FaultContext& context) {
    // A fixed number of draws per command, whichever faults hit, so that one fault's outcome does
    // not shift the draws of every command after it.
    Fault fault;
    std::mt19937_64& rng = context.rng;
    const bool drop_request = chance(rng, rates.drop_request);
    const bool drop_response = chance(rng, rates.drop_response);
    const bool delay_response = chance(rng, rates.delay_response);
    const bool execute_late = chance(rng, rates.execute_late);
    const bool duplicate = chance(rng, rates.duplicate);
    const bool unit_attention = chance(rng, rates.unit_attention);
    const std::chrono::nanoseconds response_delay = uniform(rng, rates.delay_max);
    const std::chrono::nanoseconds execute_delay = uniform(rng, rates.delay_max);
    const std::chrono::nanoseconds duplicate_interval = uniform(rng, rates.delay_max);
    fault.drop_request = drop_request;
    fault.drop_response = drop_response;
    if (delay_response) {
      fault.response_delay = response_delay;
    }
    if (execute_late) {
      fault.execute_delay = execute_delay;
    }
    if (duplicate) {
      fault.duplicates = 1;
      fault.duplicate_interval = duplicate_interval;
    }
    if (unit_attention) {
      fault.unit_attention = kUaItNexusLoss;
    }
    return fault;
  };
}

struct SimTransport::Core : std::enable_shared_from_this<Core> {
  struct Path {
    std::string name;
    LuId lu = 0;
    NexusId nexus = 0;
    bool open = true;
  };

  struct Pending {
    std::uint64_t tag = 0;
    PathId path = 0;
    SimTime submitted{0};
  };

  Core(SimTarget& target_in, SimTransportOptions options_in, UniqueFd event_in)
      : target(target_in),
        clock(target_in.clock()),
        options(std::move(options_in)),
        rng(options.seed),
        event(std::move(event_in)) {}

  LinkState link(LuId lu) const {
    const auto it = links.find(lu);
    return it == links.end() ? LinkState::kUp : it->second;
  }

  // Schedules action on the clock, to run only while the transport exists.
  void at(SimTime time, std::function<void(Core&)> action) {
    clock.schedule(time, [weak = weak_from_this(), action = std::move(action)] {
      if (const auto core = weak.lock()) {
        action(*core);
      }
    });
  }

  Completion completion_of(const Pending& command) const {
    Completion completion;
    completion.tag = command.tag;
    completion.latency = clock.now() - command.submitted;
    return completion;
  }

  // A copy of command id will no longer reach or run on the target.
  void copy_done(std::uint64_t id) {
    const auto it = copies.find(id);
    BLKFENCE_ASSERT(it != copies.end() && it->second > 0);
    if (--it->second == 0) {
      copies.erase(it);
    }
  }

  void report(std::uint64_t id, Completion completion) {
    pending.erase(id);
    ready.push_back(std::move(completion));
    // Fails only when the counter would overflow, and then it is readable anyway.
    (void)::eventfd_write(event.get(), 1);
  }

  void report_unanswered(std::uint64_t id, Outcome outcome, std::uint16_t host_status,
                         int os_errno = 0) {
    const auto it = pending.find(id);
    if (it == pending.end()) {
      return;
    }
    Completion completion = completion_of(it->second);
    completion.outcome = outcome;
    completion.host_status = host_status;
    completion.os_errno = os_errno;
    report(id, std::move(completion));
  }

  void answer_arrives(std::uint64_t id, LuId lu, const SimAnswer& answer) {
    if (link(lu) != LinkState::kUp) {
      return;  // lost on the way back
    }
    const auto it = pending.find(id);
    if (it == pending.end()) {
      return;  // reported already: timed out, path closed, or another copy's answer came first
    }
    Completion completion = completion_of(it->second);
    completion.status = answer.status;
    completion.outcome = detail::classify(detail::SgAnswer{.os_errno = 0,
                                                           .may_have_executed = false,
                                                           .status = answer.status,
                                                           .host_status = 0,
                                                           .driver_status = 0});
    completion.sense = answer.sense;
    completion.data_in = answer.data_in;
    report(id, std::move(completion));
  }

  void command_arrives(std::uint64_t id, const Path& path, const Command& command,
                       const Fault& fault, bool first_copy,
                       std::chrono::nanoseconds response_delay) {
    if (link(path.lu) != LinkState::kUp) {
      copy_done(id);
      return;  // lost on the way
    }
    if (first_copy && fault.unit_attention) {
      target.add_unit_attention(path.lu, path.nexus, *fault.unit_attention);
    }
    target.submit(path.lu, path.nexus, command, fault.execute_delay,
                  [weak = weak_from_this(), id, lu = path.lu, response_delay,
                   lost = fault.drop_response](SimAnswer answer) {
                    const auto core = weak.lock();
                    if (!core) {
                      return;
                    }
                    core->copy_done(id);  // it ran, was refused or was aborted
                    if (lost) {
                      return;
                    }
                    core->at(core->clock.now() + response_delay,
                             [id, lu, answer = std::move(answer)](Core& self) {
                               self.answer_arrives(id, lu, answer);
                             });
                  });
  }

  Result<void> submit(PathId path_id, Command command) {
    const auto it = paths.find(path_id);
    if (it == paths.end() || !it->second.open) {
      return fail(ErrorCode::kInvalidArgument,
                  "submit: path " + std::to_string(path_id) + " is not open");
    }
    if (auto checked = detail::check_command(command); !checked) {
      return checked;
    }
    const Path path = it->second;
    const std::uint64_t id = next_id++;
    const SimTime now = clock.now();
    BLKFENCE_ASSERT(options.latency_min <= options.latency_max);
    const std::chrono::nanoseconds latency =
        options.latency_min + uniform(rng, options.latency_max - options.latency_min);
    const Fault fault =
        options.fault
            ? options.fault(FaultContext{id, path_id, path.lu, path.nexus, command, now, rng})
            : Fault{};
    pending.emplace(id, Pending{command.tag, path_id, now});
    at(now + command.timeout + options.deadline_grace,
       [id](Core& self) { self.report_unanswered(id, Outcome::kIndeterminate, 0); });
    if (options.host_queues && options.host_queues->held(path.nexus)) {
      hold(id, path, std::move(command), fault);
      return {};
    }
    send(id, path, std::move(command), fault, latency);
    return {};
  }

  // Command id waits in the host's queue of its path (SimHostQueues), and may still reach the
  // target: it goes out when the path recovers, even once this transport is gone.
  void hold(std::uint64_t id, const Path& path, Command command, const Fault& fault) {
    copies[id] = 1;
    auto shared = std::make_shared<Command>(std::move(command));
    options.host_queues->enqueue(
        path.nexus, options.queue_at_head,
        [weak = weak_from_this(), &target = target, &clock = clock, id, path, shared, fault,
         latency_min = options.latency_min](bool recovered) {
          const auto core = weak.lock();
          if (core) {
            core->copy_done(id);
            if (recovered) {
              // One connection carries the queue in its order: each takes the least latency.
              core->send(id, path, std::move(*shared), fault, core->options.latency_min);
            } else {
              core->report_unanswered(id, Outcome::kTransportError, kDidTransportFailfast);
            }
            return;
          }
          if (recovered) {
            clock.schedule(clock.now() + latency_min / 2, [&target, path, shared, fault] {
              target.submit(path.lu, path.nexus, *shared, fault.execute_delay,
                            [](const SimAnswer& /*ignored: nobody waits*/) {});
            });
          }
        });
  }

  // Command id leaves the host now, on its way to the target: its faults and the link decide
  // whether and when it arrives.
  void send(std::uint64_t id, const Path& path, Command command, const Fault& fault,
            std::chrono::nanoseconds latency) {
    const SimTime now = clock.now();
    if (fault.transport_error || link(path.lu) == LinkState::kNoConnect) {
      at(now + latency,
         [id](Core& self) { self.report_unanswered(id, Outcome::kTransportError, kDidNoConnect); });
      return;
    }
    if (fault.os_errno != 0) {
      at(now + latency, [id, os_errno = fault.os_errno](Core& self) {
        self.report_unanswered(id, Outcome::kOsError, 0, os_errno);
      });
      return;
    }
    if (fault.drop_request || link(path.lu) == LinkState::kNoAnswer) {
      return;
    }
    const std::chrono::nanoseconds request_delay = latency / 2 + fault.request_delay;
    const std::chrono::nanoseconds response_delay = latency - latency / 2 + fault.response_delay;
    copies[id] = fault.duplicates + 1;
    auto shared = std::make_shared<const Command>(std::move(command));
    for (std::uint32_t copy = 0; copy <= fault.duplicates; ++copy) {
      at(now + request_delay + copy * fault.duplicate_interval,
         [id, path, shared, fault, copy, response_delay](Core& self) {
           self.command_arrives(id, path, *shared, fault, copy == 0, response_delay);
         });
    }
  }

  SimTarget& target;
  SimClock& clock;
  SimTransportOptions options;
  std::mt19937_64 rng;
  UniqueFd event;
  std::map<PathId, Path> paths;
  PathId next_path = 0;
  std::map<LuId, LinkState> links;
  std::map<std::uint64_t, Pending> pending;  // submitted, not yet reported
  // Commands with copies that may still reach or run on the target: how many.
  std::map<std::uint64_t, std::uint32_t> copies;
  std::vector<Completion> ready;  // reported, not yet reaped
  std::uint64_t next_id = 0;
};

Result<std::unique_ptr<SimTransport>> SimTransport::make(SimTarget& target,
                                                         SimTransportOptions options) {
  UniqueFd event(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!event.valid()) {
    return tl::unexpected(Error::os(errno, "eventfd for the simulated transport's poll fd"));
  }
  auto core = std::make_shared<Core>(target, std::move(options), std::move(event));
  return std::unique_ptr<SimTransport>(new SimTransport(std::move(core)));
}

SimTransport::~SimTransport() = default;

Result<PathId> SimTransport::open_path(const std::string& device) {
  const auto found = core_->target.find_path(device);
  if (!found) {
    return tl::unexpected(Error::os(ENOENT, "open " + device + " read-write"));
  }
  const PathId id = core_->next_path++;
  core_->paths.emplace(id, Core::Path{device, found->lu, found->nexus, true});
  return id;
}

void SimTransport::close_path(PathId path) {
  const auto it = core_->paths.find(path);
  if (it == core_->paths.end() || !it->second.open) {
    return;
  }
  it->second.open = false;
  std::vector<std::uint64_t> held;
  for (const auto& [id, command] : core_->pending) {
    if (command.path == path) {
      held.push_back(id);
    }
  }
  for (const std::uint64_t id : held) {
    core_->report_unanswered(id, Outcome::kIndeterminate, 0);
  }
}

std::optional<DeviceNumber> SimTransport::device_of(PathId path) const {
  const auto it = core_->paths.find(path);
  if (it == core_->paths.end() || !it->second.open) {
    return std::nullopt;
  }
  return DeviceNumber{.is_char = true, .major = 0, .minor = it->second.lu};
}

std::size_t SimTransport::open_paths() const {
  return static_cast<std::size_t>(std::count_if(core_->paths.begin(), core_->paths.end(),
                                                [](const auto& path) { return path.second.open; }));
}

std::size_t SimTransport::opened_paths() const {
  return core_->paths.size();
}

Result<void> SimTransport::submit(PathId path, Command command) {
  return core_->submit(path, std::move(command));
}

Result<std::size_t> SimTransport::reap(std::chrono::milliseconds wait,
                                       std::vector<Completion>& out) {
  Core& core = *core_;
  std::uint64_t count = 0;
  // Non-blocking: EAGAIN means nothing was signalled.
  (void)::read(core.event.get(), &count, sizeof count);
  const SimTime end = core.clock.now() + std::max(wait, std::chrono::milliseconds(0));
  core.clock.advance_to(core.clock.now());  // what is due already
  while (core.ready.empty()) {
    const auto next = core.clock.next_event();
    if (!next || *next > end) {
      core.clock.advance_to(end);
      break;
    }
    core.clock.advance_to(*next);
  }
  const std::size_t reaped = core.ready.size();
  std::move(core.ready.begin(), core.ready.end(), std::back_inserter(out));
  core.ready.clear();
  (void)::read(core.event.get(), &count, sizeof count);
  return reaped;
}

std::optional<std::size_t> SimTransport::unreturned() const {
  return static_cast<std::size_t>(
      std::count_if(core_->copies.begin(), core_->copies.end(),
                    [this](const auto& entry) { return !core_->pending.contains(entry.first); }));
}

std::size_t SimTransport::in_flight() const {
  return core_->pending.size() + core_->ready.size();
}

int SimTransport::poll_fd() const {
  return core_->event.get();
}

void SimTransport::set_link(LuId lu, LinkState state) {
  core_->links[lu] = state;
}

SimTarget& SimTransport::target() const {
  return core_->target;
}

}  // namespace blkfence::transport

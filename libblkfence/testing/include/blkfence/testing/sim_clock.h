// Simulated time and the one event queue of a simulation (transport layer, tests and simulation).
//
// Everything simulated (the SPC-4 target's held commands, every SimTransport's latencies,
// deadlines and lost answers) schedules its future on one SimClock, so that events of several
// simulated nodes run in one global order: by time, then by the order they were scheduled. Time
// moves only when advance() or advance_to() is called, never by itself, which makes a simulation
// deterministic and as fast as the CPU (TigerBeetle's simulator works the same way). An event
// runs with now() set to its own time. The clock owns the queued actions; whoever schedules one
// cancels it before anything the action refers to goes away. Not thread-safe: a simulation runs on
// one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>

namespace blkfence::transport {

// Time since the simulation started.
using SimTime = std::chrono::nanoseconds;

class SimClock {
 public:
  using EventId = std::uint64_t;

  SimClock() = default;
  SimClock(const SimClock&) = delete;
  SimClock& operator=(const SimClock&) = delete;

  SimTime now() const { return now_; }

  // Runs every event due up to now() + duration (including those the events themselves schedule
  // within that span), each at its own time, then leaves now() there. Events must not advance the
  // clock themselves.
  void advance(std::chrono::nanoseconds duration);
  void advance_to(SimTime time);

  // Queues action to run at time, which must not be in the past; events at the same time run in
  // the order they were scheduled.
  EventId schedule(SimTime time, std::function<void()> action);
  EventId schedule_after(std::chrono::nanoseconds delay, std::function<void()> action) {
    return schedule(now_ + delay, std::move(action));
  }
  // False when the event already ran or was cancelled.
  bool cancel(EventId id);

  std::optional<SimTime> next_event() const;
  std::size_t pending() const { return events_.size(); }

 private:
  SimTime now_{0};
  EventId next_id_ = 1;
  bool running_ = false;
  std::map<std::pair<SimTime, EventId>, std::function<void()>> events_;
  std::unordered_map<EventId, SimTime> time_of_;
};

}  // namespace blkfence::transport

// The simulated clock's event queue (transport layer). Not thread-safe, like SimClock.
#include "blkfence/testing/sim_clock.h"

#include "blkfence/assert.h"

namespace blkfence::transport {

void SimClock::advance(std::chrono::nanoseconds duration) {
  BLKFENCE_ASSERT(duration.count() >= 0);
  advance_to(now_ + duration);
}

void SimClock::advance_to(SimTime time) {
  BLKFENCE_ASSERT(time >= now_);
  // An event that advanced the clock would run later events inside an earlier one.
  BLKFENCE_ASSERT(!running_);
  running_ = true;
  while (!events_.empty() && events_.begin()->first.first <= time) {
    auto node = events_.extract(events_.begin());
    time_of_.erase(node.key().second);
    now_ = node.key().first;
    node.mapped()();
  }
  now_ = time;
  running_ = false;
}

SimClock::EventId SimClock::schedule(SimTime time, std::function<void()> action) {
  BLKFENCE_ASSERT(time >= now_);
  BLKFENCE_ASSERT(action);
  const EventId id = next_id_++;
  events_.emplace(std::make_pair(time, id), std::move(action));
  time_of_.emplace(id, time);
  return id;
}

bool SimClock::cancel(EventId id) {
  const auto it = time_of_.find(id);
  if (it == time_of_.end()) {
    return false;
  }
  events_.erase(std::make_pair(it->second, id));
  time_of_.erase(it);
  return true;
}

std::optional<SimTime> SimClock::next_event() const {
  if (events_.empty()) {
    return std::nullopt;
  }
  return events_.begin()->first.first;
}

}  // namespace blkfence::transport

// Proves the simulated clock: events run in time order and, at equal times, in the order they
// were scheduled, each with now() at its own time; events scheduled by events within the span run
// in the same advance; a cancelled event never runs; time never moves unless advanced.
#include "blkfence/testing/sim_clock.h"

#include <string>

#include <gtest/gtest.h>

namespace blkfence::transport {
namespace {

using std::chrono::milliseconds;

TEST(SimClock, RunsEventsInTimeThenSchedulingOrderAtTheirOwnTime) {
  SimClock clock;
  std::string order;
  std::vector<SimTime> seen;
  const auto event = [&](char name) {
    return [&, name] {
      order += name;
      seen.push_back(clock.now());
    };
  };
  clock.schedule(milliseconds(5), event('c'));
  clock.schedule(milliseconds(1), event('a'));
  clock.schedule(milliseconds(5), event('d'));
  clock.schedule_after(milliseconds(2), event('b'));
  EXPECT_EQ(clock.next_event(), milliseconds(1));
  clock.advance(milliseconds(4));
  EXPECT_EQ(order, "ab");
  EXPECT_EQ(clock.now(), milliseconds(4));
  clock.advance_to(milliseconds(5));
  EXPECT_EQ(order, "abcd");
  EXPECT_EQ(seen, (std::vector<SimTime>{milliseconds(1), milliseconds(2), milliseconds(5),
                                        milliseconds(5)}));
  EXPECT_EQ(clock.next_event(), std::nullopt);
}

TEST(SimClock, EventsScheduledByEventsRunInTheSameAdvance) {
  SimClock clock;
  int ran = 0;
  clock.schedule(milliseconds(1), [&] {
    ++ran;
    clock.schedule_after(milliseconds(0), [&] {
      ++ran;
      clock.schedule_after(milliseconds(3), [&] { ++ran; });
    });
  });
  clock.advance(milliseconds(3));
  EXPECT_EQ(ran, 2);
  clock.advance(milliseconds(1));
  EXPECT_EQ(ran, 3);
}

TEST(SimClock, CancelledEventsNeverRun) {
  SimClock clock;
  bool ran = false;
  const SimClock::EventId id = clock.schedule(milliseconds(1), [&] { ran = true; });
  EXPECT_EQ(clock.pending(), 1U);
  EXPECT_TRUE(clock.cancel(id));
  EXPECT_FALSE(clock.cancel(id));
  clock.advance(milliseconds(2));
  EXPECT_FALSE(ran);
  EXPECT_EQ(clock.now(), milliseconds(2));
  EXPECT_EQ(clock.pending(), 0U);
}

}  // namespace
}  // namespace blkfence::transport

// Proves that a record never waits for the journal or stderr (log.h): while the writer is stalled
// (journald not reading, a full stderr pipe; here a sink that blocks), log() returns at once, the
// queue takes kLogQueueMax records and drops the rest, counting them, and once the writer moves
// again every queued record is written in the order logged, followed by a warning that says how
// many were dropped there.
#include "log.h"

#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace blkfence::daemon {
namespace {

TEST(LogTest, ARecordNeverWaitsForAStalledWriterAndDropsAreCountedInOrder) {
  ASSERT_TRUE(flush_log(std::chrono::seconds(10)));  // nothing of earlier tests left
  std::mutex mutex;
  std::condition_variable changed;
  bool stalled = false;
  bool release = false;
  std::vector<std::string> written;
  set_log_sink_for_testing([&](Priority, const std::string& message, const LogFields&) {
    std::unique_lock lock(mutex);
    written.push_back(message);
    stalled = true;
    changed.notify_all();
    changed.wait(lock, [&] { return release; });
  });
  constexpr std::size_t kDropped = 100;
  const std::uint64_t dropped_before = log_dropped();
  // Record 0 stalls the writer; then the queue fills, and the last kDropped find it full.
  auto logging = std::async(std::launch::async, [&] {
    log(Priority::kInfo, "record 0");
    {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return stalled; });
    }
    for (std::size_t i = 1; i <= kLogQueueMax + kDropped; ++i) {
      log(Priority::kInfo, "record " + std::to_string(i));
    }
  });
  const bool returned = logging.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  const std::uint64_t dropped = log_dropped() - dropped_before;
  {
    const std::lock_guard lock(mutex);
    release = true;
  }
  changed.notify_all();
  logging.wait();
  ASSERT_TRUE(returned) << "log() waited for the stalled writer";
  EXPECT_EQ(dropped, kDropped);
  ASSERT_TRUE(flush_log(std::chrono::seconds(10)));
  set_log_sink_for_testing({});
  std::vector<std::string> expected;
  for (std::size_t i = 0; i <= kLogQueueMax; ++i) {
    expected.push_back("record " + std::to_string(i));
  }
  expected.push_back(std::to_string(kDropped) +
                     " log record(s) dropped here: the journal or stderr did not take them fast "
                     "enough (blkfence_log_dropped_total counts them all)");
  const std::lock_guard lock(mutex);
  EXPECT_EQ(written, expected);
}

}  // namespace
}  // namespace blkfence::daemon

// Proves HostQueues (docs/protocol.md, "Writes queued in the initiator") on fake maps and a fake
// device-mapper: stopping tells fail_if_no_path only to the maps that queue, and remembers them in
// run_dir; giving back tells queue_if_no_path only to those, so a map the administrator set to
// fail stays so; a daemon started again on the same run_dir gives back what the one before
// stopped; a map that cannot be told, or whose table cannot be read, stays remembered until it is
// given back.
#include "host_queues.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <unistd.h>

namespace blkfence::daemon {
namespace {

namespace fs = std::filesystem;

class HostQueuesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = fs::temp_directory_path() / ("blkfence-host-queues-" + std::to_string(::getpid()));
    fs::remove_all(run_dir_);
    fs::create_directories(run_dir_);
    // dm-3 queues, dm-4 is set to fail by its administrator; both over the LU's paths.
    queueing_ = {{3, true}, {4, false}};
    lu_ = pr::LogicalUnit{.wwn = "naa.1", .name = "/dev/sdb", .paths = {}};
  }
  void TearDown() override { fs::remove_all(run_dir_); }

  HostQueues make() {
    HostQueues::MapsOf maps =
        [this](const pr::LogicalUnit&) -> Result<std::vector<pr::MultipathMap>> {
      std::vector<pr::MultipathMap> listed;
      for (const auto& [minor, queueing] : queueing_) {
        listed.push_back({.name = "dm-" + std::to_string(minor),
                          .major = 253,
                          .minor = minor,
                          .queueing = queueing || !unread_.empty(),
                          .unread = unread_});
      }
      return listed;
    };
    pr::DeviceMapper dm;
    dm.message = [this](unsigned major, unsigned minor,
                        const std::string& message) -> Result<void> {
      told_.push_back(std::to_string(major) + ":" + std::to_string(minor) + " " + message);
      if (refuse_) {
        return tl::unexpected(Error::os(ENXIO, "message " + message));
      }
      queueing_[minor] = message == "queue_if_no_path";
      return {};
    };
    return HostQueues(run_dir_.string(), std::move(maps), std::move(dm));
  }

  std::string remembered() const {
    std::ifstream file(run_dir_ / "db.queueing");
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  }

  fs::path run_dir_;
  std::map<unsigned, bool> queueing_;
  pr::LogicalUnit lu_;
  std::vector<std::string> told_;
  bool refuse_ = false;
  std::string unread_;  // every map's table unreadable, for this reason
};

TEST_F(HostQueuesTest, OnlyTheMapsItStoppedQueueAgain) {
  HostQueues queues = make();
  ASSERT_TRUE(queues.set("db", lu_, false).has_value());
  EXPECT_EQ(told_, std::vector<std::string>{"253:3 fail_if_no_path"});
  EXPECT_EQ(remembered(), "253:3\n");
  EXPECT_FALSE(queueing_[3]);

  // Stopped again (a REGISTER after the gate closed): nothing queues, nothing is told.
  ASSERT_TRUE(queues.set("db", lu_, false).has_value());
  EXPECT_EQ(told_.size(), 1U);

  ASSERT_TRUE(queues.set("db", lu_, true).has_value());
  EXPECT_EQ(told_, (std::vector<std::string>{"253:3 fail_if_no_path", "253:3 queue_if_no_path"}));
  EXPECT_TRUE(queueing_[3]);
  EXPECT_FALSE(queueing_[4]) << "the administrator's choice";
  EXPECT_FALSE(fs::exists(run_dir_ / "db.queueing"));
}

// A map that queues again by the time the gate opens (multipathd turned it back on) has nothing to
// be given: it is forgotten, so a later fail_if_no_path of its administrator's stays.
TEST_F(HostQueuesTest, AMapQueueingAgainByItselfIsForgotten) {
  HostQueues queues = make();
  ASSERT_TRUE(queues.set("db", lu_, false).has_value());
  queueing_[3] = true;  // multipathd
  told_.clear();
  ASSERT_TRUE(queues.set("db", lu_, true).has_value());
  EXPECT_TRUE(told_.empty());
  EXPECT_FALSE(fs::exists(run_dir_ / "db.queueing"));
}

// A map blkfenced stopped whose table cannot be read when the gate opens (suspended by a reload)
// is given back all the same, and stays remembered until that is done.
TEST_F(HostQueuesTest, AStoppedMapWhoseTableCannotBeReadIsStillGivenBack) {
  HostQueues queues = make();
  ASSERT_TRUE(queues.set("db", lu_, false).has_value());
  told_.clear();
  unread_ = "the table of dm-3, device-mapper device 253:3 is suspended";
  refuse_ = true;
  EXPECT_FALSE(queues.set("db", lu_, true).has_value());
  EXPECT_EQ(remembered(), "253:3\n") << "not given back yet";
  refuse_ = false;
  ASSERT_TRUE(queues.set("db", lu_, true).has_value());
  EXPECT_EQ(told_, (std::vector<std::string>{"253:3 queue_if_no_path", "253:3 queue_if_no_path"}));
  EXPECT_TRUE(queueing_[3]);
  EXPECT_FALSE(queueing_[4]) << "not blkfenced's to give";
  EXPECT_FALSE(fs::exists(run_dir_ / "db.queueing"));
}

TEST_F(HostQueuesTest, ADaemonStartedAgainGivesBackWhatTheOneBeforeStopped) {
  ASSERT_TRUE(make().set("db", lu_, false).has_value());
  told_.clear();
  HostQueues restarted = make();
  ASSERT_TRUE(restarted.set("db", lu_, true).has_value());
  EXPECT_EQ(told_, std::vector<std::string>{"253:3 queue_if_no_path"});
  EXPECT_TRUE(queueing_[3]);
}

TEST_F(HostQueuesTest, AMapThatCannotBeToldIsAnErrorAndStaysRemembered) {
  HostQueues queues = make();
  refuse_ = true;
  const auto stopped = queues.set("db", lu_, false);
  ASSERT_FALSE(stopped.has_value());
  EXPECT_EQ(stopped.error().errno_value(), ENXIO);
  EXPECT_NE(stopped.error().message().find("dm-3"), std::string::npos) << stopped.error().message();
  EXPECT_EQ(remembered(), "253:3\n") << "it may have been stopped all the same";

  // A map whose table could not be read is told, and not remembered (it may not have been
  // queueing); when telling fails too, the error says both.
  refuse_ = false;
  told_.clear();
  unread_ = "the table of dm-3, device-mapper device 253:3 is suspended";
  queueing_ = {{3, true}};
  ASSERT_TRUE(queues.set("other", lu_, false).has_value());
  EXPECT_EQ(told_, std::vector<std::string>{"253:3 fail_if_no_path"});
  EXPECT_FALSE(fs::exists(run_dir_ / "other.queueing"));
  refuse_ = true;
  const auto both = queues.set("other", lu_, false);
  ASSERT_FALSE(both.has_value());
  EXPECT_NE(both.error().message().find("is suspended; "), std::string::npos)
      << both.error().message();

  // Listing the maps fails: so does stopping them, since one may hold writes.
  HostQueues blind(
      run_dir_.string(),
      [](const pr::LogicalUnit&) -> Result<std::vector<pr::MultipathMap>> {
        return fail(ErrorCode::kOs, "the table of dm-3, device-mapper: gone");
      },
      pr::DeviceMapper{});
  EXPECT_FALSE(blind.set("db", lu_, false).has_value());
}

}  // namespace
}  // namespace blkfence::daemon

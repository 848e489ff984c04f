// Proves what keeps one blkfenced per node sane across its life (daemon.cc): a second daemon on the
// same run_dir refuses to start, names the first one's pid, and leaves the first one's control
// socket serving; once the first is gone the run_dir is free again. A real Daemon without
// resources, as in daemon_control_test.cc: no device is needed.
#include <gtest/gtest.h>
#include <unistd.h>

#include "blkfence/control/protocol.h"

#include "daemon.h"
#include "glue_testing.h"
#include "log.h"

namespace blkfence::daemon {
namespace {

using testing::RawClient;
using testing::TempDir;

Config config_in(const TempDir& dir) {
  Config config;
  config.cluster = "glue";
  config.node_id = 7;
  config.state_dir = dir / "state";
  config.run_dir = dir / "run";
  config.transport = "sgio";  // no device is ever opened: there is no resource
  return config;
}

class DaemonLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override { set_log_target(LogTarget::kStderr); }
  void TearDown() override {
    if (event_ != nullptr) {
      sd_event_unref(event_);
    }
  }
  TempDir dir_;
  sd_event* event_ = nullptr;
};

TEST_F(DaemonLifecycleTest, ASecondDaemonOnTheSameRunDirRefusesAndTheFirstGoesOn) {
  auto first = Daemon::make(config_in(dir_));
  ASSERT_TRUE(first) << first.error().message();
  ASSERT_GE(sd_event_default(&event_), 0);

  auto second = Daemon::make(config_in(dir_));
  ASSERT_FALSE(second) << "two daemons on one run_dir";
  EXPECT_EQ(second.error().code(), ErrorCode::kBusy);
  EXPECT_NE(
      second.error().message().find("another blkfenced (pid " + std::to_string(::getpid()) + ")"),
      std::string::npos)
      << second.error().message();
  EXPECT_NE(second.error().message().find(dir_ / "run"), std::string::npos)
      << second.error().message();

  // The first one's socket was not taken over: it still answers.
  RawClient client(event_, dir_ / "run/control.sock");
  ASSERT_TRUE(client.connected());
  client.write(control::encode_request(
      {.id = 9, .op = control::Op::kStatus, .resource = {}, .node = {}, .timeout = {}}));
  const auto line = client.read_line();
  ASSERT_TRUE(line);
  const auto reply = control::parse_reply(*line);
  ASSERT_TRUE(reply) << *line;
  EXPECT_TRUE(reply->ok) << *line;
  EXPECT_EQ(reply->id, 9U);
  client.close();

  first->reset();
  auto third = Daemon::make(config_in(dir_));
  EXPECT_TRUE(third) << "the run_dir stays locked after its daemon is gone: "
                     << third.error().message();
}

}  // namespace
}  // namespace blkfence::daemon

// Proves what keeps one blkfenced per node sane across its life (daemon.cc): a second daemon on the
// same run_dir refuses to start, names the first one's pid, and leaves the first one's control
// socket serving; once the first is gone the run_dir is free again. A resource whose device the
// host does not have yet waits (state unknown, gate closed) instead of stopping the start. One LU
// named by two resources, by two different names, stops the start; found only once a waiting
// resource's devices appear, it keeps that resource out. A real Daemon without resources, as in
// daemon_control_test.cc, or on a simulated target (sim_daemon_testing.h).
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <unistd.h>

#include "blkfence/control/protocol.h"

#include "daemon.h"
#include "glue_testing.h"
#include "log.h"
#include "sim_daemon_testing.h"

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

// The reply to one request line on a fresh connection.
control::Reply ask(sd_event* event, const std::string& socket, const control::Request& request) {
  RawClient client(event, socket);
  client.write(control::encode_request(request));
  const auto line = client.read_line();
  if (!line) {
    ADD_FAILURE() << "no reply";
    return {};
  }
  auto reply = control::parse_reply(*line);
  if (!reply) {
    ADD_FAILURE() << "unreadable reply " << *line;
    return {};
  }
  return *reply;
}

// A LU this host does not have yet (an iSCSI login still to come at boot) is not a configuration
// error: the daemon starts, the resource waits in state unknown with its gate closed, status says
// what it waits for, and an operation on it is refused with that reason. (That it is picked up
// when the device appears is proven in the lab: tests/lab/daemon/e2e.sh, iSCSI.)
TEST_F(DaemonLifecycleTest, AResourceWhoseDeviceIsMissingWaitsInsteadOfStoppingTheDaemon) {
  Config config = config_in(dir_);
  const std::string missing = dir_ / "no-such-lu";
  ResourceConfig pgdata;
  pgdata.name = "pgdata";
  pgdata.devices = {missing};
  config.resources.push_back(pgdata);
  auto daemon = Daemon::make(std::move(config));
  ASSERT_TRUE(daemon) << daemon.error().message();
  ASSERT_GE(sd_event_default(&event_), 0);
  const std::string socket = dir_ / "run/control.sock";

  const auto status =
      ask(event_, socket,
          {.id = 1, .op = control::Op::kStatus, .resource = "pgdata", .node = {}, .timeout = {}});
  ASSERT_TRUE(status.ok) << status.body.dump();
  ASSERT_EQ(status.body["resources"].size(), 1U) << status.body.dump();
  const auto& shown = status.body["resources"][0];
  EXPECT_EQ(shown["name"], "pgdata");
  EXPECT_EQ(shown["state"], "unknown");
  EXPECT_EQ(shown["gate_open"], false);
  EXPECT_NE(shown["detail"].get<std::string>().find("waiting for its devices: " + missing),
            std::string::npos)
      << shown.dump();

  const auto acquire =
      ask(event_, socket,
          {.id = 2, .op = control::Op::kAcquire, .resource = "pgdata", .node = {}, .timeout = {}});
  ASSERT_FALSE(acquire.ok);
  ASSERT_TRUE(acquire.error);
  EXPECT_EQ(acquire.error->code, control::ReplyError::kDevice);
  EXPECT_NE(acquire.error->message.find("pgdata waits for its devices: " + missing),
            std::string::npos)
      << acquire.error->message;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "run/pgdata.token"));

  // Its gate is simply closed: what ExecCondition= and `gate check` ask.
  const auto gate =
      ask(event_, socket,
          {.id = 3, .op = control::Op::kGate, .resource = "pgdata", .node = {}, .timeout = {}});
  ASSERT_TRUE(gate.ok) << gate.body.dump();
  EXPECT_EQ(gate.body["open"], false);
}

// Anything else wrong with a device is still a configuration error: a file that is not a device.
TEST_F(DaemonLifecycleTest, ADeviceThatIsNotADeviceStillStopsTheStart) {
  Config config = config_in(dir_);
  const std::string file = dir_ / "not-a-device";
  { std::ofstream(file) << "x"; }
  ResourceConfig pgdata;
  pgdata.name = "pgdata";
  pgdata.devices = {file};
  config.resources.push_back(pgdata);
  auto daemon = Daemon::make(std::move(config));
  ASSERT_FALSE(daemon);
  EXPECT_EQ(daemon.error().code(), ErrorCode::kInvalidArgument) << daemon.error().message();
}

// Two names of one LU: what resolve_devices() makes of a by-id link and of the WWN it names.
DaemonEnv one_lu_by_two_names(testing::SimDevices& devices, std::atomic<bool>* second_present) {
  DaemonEnv env = devices.env();
  env.resolve = [&devices, second_present](
                    const ResourceConfig& resource) -> Result<std::vector<pr::LogicalUnit>> {
    std::vector<pr::LogicalUnit> lus;
    for (const std::string& device : resource.devices) {
      if (device == "naa.6001405000000001" && second_present != nullptr && !*second_present) {
        return tl::unexpected(Error::os(ENOENT, "resource " + resource.name + ": " + device));
      }
      (void)devices.lu("lu0");
      lus.push_back({.wwn = "naa.6001405000000001",
                     .name = device,
                     .paths = {{.sg = "/dev/sim-lu0", .sd = {}, .hctl = {}, .initiator = {}}}});
    }
    return lus;
  };
  return env;
}

Config two_resources_on_one_lu(const TempDir& dir) {
  Config config = config_in(dir);
  ResourceConfig pgdata;
  pgdata.name = "pgdata";
  pgdata.devices = {"/dev/disk/by-id/wwn-0x6001405000000001"};
  pgdata.on_fenced.action = OnFencedAction::kNone;
  ResourceConfig pgwal = pgdata;
  pgwal.name = "pgwal";
  pgwal.devices = {"naa.6001405000000001"};
  config.resources = {pgdata, pgwal};
  return config;
}

// The configuration compares names only; the daemon compares the LUs they resolve to.
TEST_F(DaemonLifecycleTest, OneLuNamedByTwoResourcesUnderTwoNamesStopsTheStart) {
  testing::SimDevices devices;
  auto daemon = Daemon::make(two_resources_on_one_lu(dir_), one_lu_by_two_names(devices, nullptr));
  ASSERT_FALSE(daemon);
  EXPECT_EQ(daemon.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(daemon.error().where(),
            "resource pgwal: its device \"naa.6001405000000001\" is LU naa.6001405000000001, "
            "which resource pgdata has already (as \"/dev/disk/by-id/wwn-0x6001405000000001\"): "
            "a LU belongs to one resource; name it in one resource only");
}

// A resource that waited for its devices and then finds them to be another resource's LU stays
// out: the daemon runs on, the first resource keeps its LU, and status says why.
TEST_F(DaemonLifecycleTest, AWaitingResourceWhoseDevicesTurnOutToBeAnotherResourcesLuStaysOut) {
  testing::SimDevices devices;
  std::atomic<bool> second_present{false};
  testing::DaemonThread daemon(two_resources_on_one_lu(dir_),
                               one_lu_by_two_names(devices, &second_present));
  ASSERT_EQ(daemon.error(), "");
  second_present = true;  // found at the next look for waiting resources (Daemon::kWaitingRetry)

  testing::LineClient client(dir_ / "run/control.sock");
  // Far beyond the daemon's next look (every 5 s without a device event); a failure otherwise.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  nlohmann::json pgwal;
  std::uint64_t id = 0;
  for (;;) {
    control::Request status{
        .id = ++id, .op = control::Op::kStatus, .resource = {}, .node = {}, .timeout = {}};
    ASSERT_TRUE(client.write(control::encode_request(status)));
    const auto line = client.read_line(std::chrono::seconds(10));
    ASSERT_TRUE(line) << "no reply to status";
    const auto reply = control::parse_reply(*line);
    ASSERT_TRUE(reply && reply->ok) << *line;
    ASSERT_EQ(reply->body["resources"].size(), 2U) << *line;
    pgwal = reply->body["resources"][1];
    if (pgwal.value("detail", "").find("a LU belongs to one resource") != std::string::npos) {
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "pgwal's detail never named the shared LU: " << pgwal.dump();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(pgwal["name"], "pgwal");
  EXPECT_EQ(pgwal["state"], "unknown");
  EXPECT_EQ(pgwal["gate_open"], false);
  EXPECT_EQ(pgwal["detail"],
            "refused: its device \"naa.6001405000000001\" is LU naa.6001405000000001, which "
            "resource pgdata has already (as \"/dev/disk/by-id/wwn-0x6001405000000001\"): a LU "
            "belongs to one resource; name it in one resource only and restart blkfenced")
      << pgwal.dump();
  // pgdata keeps its LU: a resource of the daemon, its state read from the LU.
  control::Request status{
      .id = ++id, .op = control::Op::kStatus, .resource = "pgdata", .node = {}, .timeout = {}};
  ASSERT_TRUE(client.write(control::encode_request(status)));
  auto line = client.read_line(std::chrono::seconds(10));
  ASSERT_TRUE(line);
  const auto pgdata = control::parse_reply(*line);
  ASSERT_TRUE(pgdata && pgdata->ok) << *line;
  EXPECT_EQ(pgdata->body["resources"][0]["lus"][0]["wwn"], "naa.6001405000000001") << *line;
  EXPECT_EQ(pgdata->body["resources"][0]["detail"].get<std::string>().find("refused"),
            std::string::npos)
      << *line;
  // pgwal cannot be acquired: the daemon says why.
  control::Request acquire{
      .id = ++id, .op = control::Op::kAcquire, .resource = "pgwal", .node = {}, .timeout = {}};
  ASSERT_TRUE(client.write(control::encode_request(acquire)));
  line = client.read_line(std::chrono::seconds(10));
  ASSERT_TRUE(line);
  const auto refused = control::parse_reply(*line);
  ASSERT_TRUE(refused && !refused->ok && refused->error) << *line;
  EXPECT_EQ(refused->error->code, control::ReplyError::kDevice);
  EXPECT_TRUE(refused->error->message.starts_with("resource pgwal is refused: its device "))
      << refused->error->message;
  EXPECT_EQ(daemon.stop(), 0);
}

}  // namespace
}  // namespace blkfence::daemon

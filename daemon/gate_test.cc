// Proves the writer gate's effects on this node (gate.h, docs/design.md §5) in a temporary run
// directory: the token file holds exactly the key and a newline, mode 0644, is replaced by rename
// (a reader of the old one still reads a whole token) and is removed when the gate closes; an
// on_fenced command runs with BLKFENCE_RESOURCE, BLKFENCE_REASON, BLKFENCE_KEY and BLKFENCE_EPOCH
// in its environment (and the daemon's own), its own process group and no blocked signals, and is
// reaped by the event loop, its exit status or the signal that killed it logged with the resource;
// "none", a release, stop-units and kill-units without units, and a command that cannot start run
// nothing. Against a private dbus-daemon (and a fake systemd on it): every KillUnit and StopUnit
// (and a reboot's StartUnit) is sent with the unit, and its error reply or its job is logged with
// the unit and the resource; with no bus at all each is logged too; after the bus daemon is killed
// and started again, the next action reaches the new one, whether or not the loop had seen the old
// connection close, and a call the old one left unanswered is sent again on the new one.
#include "gate.h"

#include <csignal>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "glue_testing.h"
#include "log.h"

namespace blkfence::daemon {
namespace {

using testing::FakeSystemd;
using testing::LogCapture;
using testing::PrivateBus;
using testing::run_until;
using testing::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

fence::Key key_of(std::uint64_t value) {
  return *fence::Key::from_value(value);
}

class GateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // As blkfenced's main() does: sd-event watches children only with SIGCHLD blocked.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGCHLD);
    ASSERT_EQ(sigprocmask(SIG_BLOCK, &signals, nullptr), 0);
  }
  void SetUp() override {
    set_log_target(LogTarget::kStderr);
    ASSERT_GE(sd_event_new(&event_), 0);
    gate_ = std::make_unique<Gate>(event_, dir_.path());
  }
  void TearDown() override {
    gate_.reset();
    sd_event_unref(event_);
  }

  TempDir dir_;
  sd_event* event_ = nullptr;
  std::unique_ptr<Gate> gate_;
};

// --- the token file -----------------------------------------------------------------------------

TEST_F(GateTest, OpenWritesTheTokenAndNewlineMode0644) {
  const mode_t old_umask = ::umask(022);
  const auto opened = gate_->open("pgdata", key_of(0x6c9d000100000007));
  ::umask(old_umask);
  ASSERT_TRUE(opened) << opened.error().message();
  EXPECT_EQ(gate_->token_path("pgdata"), dir_ / "pgdata.token");
  EXPECT_EQ(read_file(dir_ / "pgdata.token"), "0x6c9d000100000007\n");
  struct stat st {};
  ASSERT_EQ(::stat((dir_ / "pgdata.token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644U);
  EXPECT_NE(::access((dir_ / "pgdata.token.new").c_str(), F_OK), 0);  // nothing left behind
}

TEST_F(GateTest, ANewTokenReplacesTheOldOneByRename) {
  ASSERT_TRUE(gate_->open("pgdata", key_of(0x6c9d000100000007)));
  // A reader that opened the old token keeps reading it whole: the new one is another file.
  const UniqueFd reader(::open((dir_ / "pgdata.token").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(reader.valid());
  // A stale temporary file from a crash, longer than a token, does not leak into the new one.
  std::ofstream(dir_ / "pgdata.token.new") << std::string(100, 'z');
  ASSERT_TRUE(gate_->open("pgdata", key_of(0x6c9d000100000009)));
  EXPECT_EQ(read_file(dir_ / "pgdata.token"), "0x6c9d000100000009\n");
  char old_text[64] = {};
  ASSERT_EQ(::pread(reader.get(), old_text, sizeof old_text, 0), 19);
  EXPECT_STREQ(old_text, "0x6c9d000100000007\n");
}

TEST_F(GateTest, CloseRemovesTheTokenAndIsQuietWhenThereIsNone) {
  ASSERT_TRUE(gate_->open("pgdata", key_of(0x6c9d000100000007)));
  ASSERT_TRUE(gate_->open("other", key_of(0x6c9d000100000008)));
  gate_->close("pgdata");
  EXPECT_NE(::access((dir_ / "pgdata.token").c_str(), F_OK), 0);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(read_file(dir_ / "other.token"), "0x6c9d000100000008\n");  // another resource's stays
  gate_->close("pgdata");  // closed already: nothing to do
  EXPECT_NE(::access((dir_ / "pgdata.token").c_str(), F_OK), 0);
}

TEST_F(GateTest, OpenFailsWithThePathWhenTheRunDirectoryIsMissing) {
  Gate gate(event_, dir_ / "missing");
  const auto opened = gate.open("pgdata", key_of(0x6c9d000100000007));
  ASSERT_FALSE(opened);
  EXPECT_EQ(opened.error().code(), ErrorCode::kOs);
  EXPECT_NE(opened.error().message().find(dir_ / "missing/pgdata.token.new"), std::string::npos)
      << opened.error().message();
}

// --- on_fenced commands -------------------------------------------------------------------------

// True when this process has no child at all, reaped or not: what act() started is there as soon
// as it returns (posix_spawn() returns after the child exists), so none means none was started.
bool no_children() {
  siginfo_t info{};
  return ::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 && errno == ECHILD;
}

ResourceConfig with_command(OnFencedAction action, std::vector<std::string> command) {
  ResourceConfig config;
  config.name = "pgdata";
  config.on_fenced = {.action = action, .command = std::move(command)};
  return config;
}

// Runs a command that reports to a pipe, and collects the report once the command has exited.
class CommandTest : public GateTest {
 protected:
  void SetUp() override {
    GateTest::SetUp();
    ASSERT_TRUE(no_children()) << "a child left by an earlier test";
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    from_command_ = UniqueFd(fds[0]);
    // The write end is the one descriptor the command inherits; it reports there.
    to_test_ = UniqueFd(::fcntl(fds[1], F_DUPFD, 10));
    ::close(fds[1]);
    ASSERT_TRUE(to_test_.valid());
  }
  // A shell script's argv; its output goes to the test, after a first line with its pid.
  std::vector<std::string> script(const std::string& text) const {
    // Through /proc: dash redirects only descriptors 0 to 9.
    std::string body =
        "exec >/proc/self/fd/" + std::to_string(to_test_.get()) + "; echo $$; " + text;
    return {"/bin/sh", "-c", body};
  }
  // What the command wrote, once it has exited and the gate's event loop has reaped it.
  std::string report() {
    to_test_ = UniqueFd();  // EOF comes when the command's copy closes too
    std::string text;
    bool eof = false;
    (void)::fcntl(from_command_.get(), F_SETFL, O_NONBLOCK);
    run_until(
        event_,
        [&] {
          char chunk[4096];
          const ssize_t got = ::read(from_command_.get(), chunk, sizeof chunk);
          if (got > 0) {
            text.append(chunk, static_cast<std::size_t>(got));
          }
          eof = got == 0;
          return eof;
        },
        "the command's report");
    // The first line is the command's pid: wait for the loop to reap it (no zombie is left).
    const pid_t pid = static_cast<pid_t>(std::atol(text.substr(0, text.find('\n')).c_str()));
    if (pid <= 0) {
      ADD_FAILURE() << "the command did not report its pid: " << text;
      return {};
    }
    pid_ = pid;
    run_until(
        event_,
        [&] {
          siginfo_t info{};
          return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 &&
                 errno == ECHILD;
        },
        "the gate to reap the command");
    return text.substr(text.find('\n') + 1);
  }

  UniqueFd from_command_;
  UniqueFd to_test_;
  pid_t pid_ = 0;  // the last command's, once report() has it
};

std::map<std::string, std::string> environment_of(const std::string& env_output) {
  std::map<std::string, std::string> env;
  std::istringstream lines(env_output);
  for (std::string line; std::getline(lines, line);) {
    if (const auto equals = line.find('='); equals != std::string::npos) {
      env[line.substr(0, equals)] = line.substr(equals + 1);
    }
  }
  return env;
}

TEST_F(CommandTest, AFencedCommandGetsTheResourceReasonKeyAndEpoch) {
  ::setenv("BLKFENCE_GLUE_TEST_INHERITED", "yes", 1);
  gate_->act(with_command(OnFencedAction::kCommand, script("env")), key_of(0x6c9d00010000002a),
             Gate::Reason::kFenced);
  ::unsetenv("BLKFENCE_GLUE_TEST_INHERITED");
  const auto env = environment_of(report());
  EXPECT_EQ(env.at("BLKFENCE_RESOURCE"), "pgdata");
  EXPECT_EQ(env.at("BLKFENCE_REASON"), "fenced");
  EXPECT_EQ(env.at("BLKFENCE_KEY"), "0x6c9d00010000002a");
  EXPECT_EQ(env.at("BLKFENCE_EPOCH"), "42");
  EXPECT_EQ(env.at("BLKFENCE_GLUE_TEST_INHERITED"), "yes");
}

TEST_F(CommandTest, LostContactWithoutAKeyGivesEmptyKeyAndEpoch) {
  gate_->act(with_command(OnFencedAction::kCommand, script("env")), std::nullopt,
             Gate::Reason::kLostContact);
  const auto env = environment_of(report());
  EXPECT_EQ(env.at("BLKFENCE_REASON"), "lost-contact");
  EXPECT_EQ(env.at("BLKFENCE_KEY"), "");
  EXPECT_EQ(env.at("BLKFENCE_EPOCH"), "");
}

// The shell's process group and blocked signals, read by the shell itself (builtins only: a
// command it starts would see the shell's mask while it forks, which dash blocks then).
constexpr const char* kOwnGroupAndMask =
    "read -r pid comm state ppid pgid rest < /proc/$$/stat; echo $pgid; "
    "while read -r name value; do [ \"$name\" = SigBlk: ] && echo \"$name $value\"; done "
    "< /proc/$$/status; exit 0";

TEST_F(CommandTest, TheCommandRunsInItsOwnProcessGroupWithNoSignalBlocked) {
  // The test blocks SIGCHLD, as the daemon does; the command must not inherit that.
  gate_->act(with_command(OnFencedAction::kCommand, script(kOwnGroupAndMask)),
             key_of(0x6c9d000100000001), Gate::Reason::kFenced);
  const std::string text = report();
  std::istringstream lines(text);
  std::string pgid;
  std::string blocked;
  std::getline(lines, pgid);
  std::getline(lines, blocked);
  EXPECT_EQ(std::atol(pgid.c_str()), pid_) << "the command leads a group of its own: " << text;
  EXPECT_NE(std::atol(pgid.c_str()), ::getpgrp()) << text;
  EXPECT_EQ(blocked, "SigBlk: 0000000000000000") << text;
}

TEST_F(CommandTest, NoneAReleaseAndAnEmptyCommandRunNothing) {
  gate_->act(with_command(OnFencedAction::kNone, script("env")), key_of(0x6c9d000100000001),
             Gate::Reason::kFenced);
  EXPECT_TRUE(no_children());
  // A release stops the units (none here), whatever on_fenced says: the command is for fences.
  gate_->act(with_command(OnFencedAction::kCommand, script("env")), key_of(0x6c9d000100000001),
             Gate::Reason::kReleased);
  EXPECT_TRUE(no_children());
  gate_->act(with_command(OnFencedAction::kCommand, {}), key_of(0x6c9d000100000001),
             Gate::Reason::kFenced);
  EXPECT_TRUE(no_children());
  // stop-units and kill-units with no units configured: no bus, no child.
  gate_->act(with_command(OnFencedAction::kStopUnits, {}), key_of(0x6c9d000100000001),
             Gate::Reason::kFenced);
  gate_->act(with_command(OnFencedAction::kKillUnits, {}), key_of(0x6c9d000100000001),
             Gate::Reason::kLostContact);
  EXPECT_TRUE(no_children());
}

TEST_F(CommandTest, ACommandThatCannotStartIsReportedAndNothingRuns) {
  gate_->act(with_command(OnFencedAction::kCommand, {dir_ / "no-such-program"}),
             key_of(0x6c9d000100000001), Gate::Reason::kFenced);
  EXPECT_TRUE(no_children());
  // The gate goes on: the next fence's command runs.
  gate_->act(with_command(OnFencedAction::kCommand, script("echo ran")), key_of(0x6c9d000100000001),
             Gate::Reason::kFenced);
  EXPECT_EQ(report(), "ran\n");
}

TEST_F(CommandTest, ACommandKilledByASignalIsLoggedWithTheSignalsName) {
  const LogCapture log;
  gate_->act(with_command(OnFencedAction::kCommand, script("kill -KILL $$")),
             key_of(0x6c9d00010000002a), Gate::Reason::kFenced);
  EXPECT_EQ(report(), "");  // returns once the gate has reaped it, which is when it logs
  const auto records = log.with("on_fenced command /bin/sh failed");
  ASSERT_EQ(records.size(), 1U) << log.dump();
  EXPECT_EQ(records[0].message, "on_fenced command /bin/sh failed: killed by SIGKILL");
  EXPECT_EQ(records[0].priority, Priority::kErr);
  EXPECT_EQ(records[0].fields.resource, "pgdata");
  EXPECT_EQ(records[0].fields.key, 0x6c9d00010000002aU);
  EXPECT_EQ(records[0].fields.epoch, 42U);
}

TEST_F(CommandTest, ANonZeroExitIsLoggedWithTheStatus) {
  const LogCapture log;
  gate_->act(with_command(OnFencedAction::kCommand, script("exit 3")), key_of(0x6c9d000100000001),
             Gate::Reason::kLostContact);
  EXPECT_EQ(report(), "");
  const auto records = log.with("on_fenced command /bin/sh failed");
  ASSERT_EQ(records.size(), 1U) << log.dump();
  EXPECT_EQ(records[0].message, "on_fenced command /bin/sh failed: exit status 3");
  EXPECT_EQ(records[0].priority, Priority::kErr);
  EXPECT_EQ(records[0].fields.resource, "pgdata");
}

TEST_F(CommandTest, ACommandThatExitsZeroIsLoggedAsFinished) {
  const LogCapture log;
  gate_->act(with_command(OnFencedAction::kCommand, script("exit 0")), key_of(0x6c9d000100000001),
             Gate::Reason::kFenced);
  EXPECT_EQ(report(), "");
  const auto finished = log.with("on_fenced command /bin/sh finished");
  ASSERT_EQ(finished.size(), 1U) << log.dump();
  EXPECT_EQ(finished[0].priority, Priority::kInfo);
  EXPECT_EQ(finished[0].fields.resource, "pgdata");
}

// --- units, through the system bus -------------------------------------------------------------

ResourceConfig with_units(OnFencedAction action, std::vector<std::string> units) {
  ResourceConfig config;
  config.name = "pgdata";
  config.on_fenced = {.action = action, .command = {}};
  config.units = std::move(units);
  return config;
}

// What sd-bus answers in a reply's place when nothing owns the name (no systemd on this bus).
constexpr const char* kNoSystemd =
    "org.freedesktop.DBus.Error.ServiceUnknown: The name org.freedesktop.systemd1 was not provided "
    "by any .service files";

// A gate whose system bus is a private dbus-daemon (DBUS_SYSTEM_BUS_ADDRESS, which sd-bus reads).
class BusTest : public GateTest {
 protected:
  void SetUp() override {
    if (::access(PrivateBus::kProgram, X_OK) != 0) {
      GTEST_SKIP() << PrivateBus::kProgram << " is missing: the bus tests need a dbus-daemon";
    }
    GateTest::SetUp();
    bus_ = std::make_unique<PrivateBus>(dir_.path());
    ASSERT_TRUE(bus_->start());
    ASSERT_EQ(::setenv("DBUS_SYSTEM_BUS_ADDRESS", bus_->address().c_str(), 1), 0);
  }
  void TearDown() override {
    systemd_.reset();
    GateTest::TearDown();  // the gate's connection goes before the bus daemon does
    bus_.reset();
    ::unsetenv("DBUS_SYSTEM_BUS_ADDRESS");
  }
  // The records with text, once there are count of them (a failure after kDeadline).
  std::vector<LogCapture::Record> await(const std::string& text, std::size_t count = 1) {
    run_until(
        event_, [&] { return log_.with(text).size() >= count; }, "a record: " + text);
    return log_.with(text);
  }
  void serve_systemd(const std::string& unanswered = {}) {
    systemd_ = std::make_unique<FakeSystemd>(event_, bus_->address(), unanswered);
  }

  LogCapture log_;
  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<FakeSystemd> systemd_;
};

TEST_F(BusTest, AStopWithoutSystemdOnTheBusLogsTheErrorReplyWithUnitAndResource) {
  gate_->act(with_units(OnFencedAction::kStopUnits, {"pg.service"}), key_of(0x6c9d000100000001),
             Gate::Reason::kFenced);
  const auto records = await("asking systemd to stop pg.service failed");
  ASSERT_EQ(records.size(), 1U) << log_.dump();
  EXPECT_EQ(records[0].priority, Priority::kErr);
  EXPECT_NE(records[0].message.find(kNoSystemd), std::string::npos) << records[0].message;
  EXPECT_EQ(records[0].fields.resource, "pgdata");
}

TEST_F(BusTest, KillUnitsSendsKillThenStopForEachUnitAndLogsEachAnswer) {
  serve_systemd();
  gate_->act(with_units(OnFencedAction::kKillUnits, {"pg.service", "gone.service"}),
             key_of(0x6c9d000100000001), Gate::Reason::kLostContact);
  await("systemd accepted", 2);
  await("failed", 2);
  EXPECT_EQ(
      systemd_->calls(),
      (std::vector<std::string>{"KillUnit pg.service all 9", "StopUnit pg.service replace",
                                "KillUnit gone.service all 9", "StopUnit gone.service replace"}));
  const auto killed = log_.with("systemd accepted: send SIGKILL to every process of pg.service");
  ASSERT_EQ(killed.size(), 1U) << log_.dump();
  EXPECT_EQ(killed[0].priority, Priority::kInfo);
  EXPECT_EQ(killed[0].fields.resource, "pgdata");
  const auto stopped = log_.with("systemd accepted: stop pg.service (job ");
  ASSERT_EQ(stopped.size(), 1U) << log_.dump();
  EXPECT_EQ(stopped[0].fields.resource, "pgdata");
  // The unit systemd does not know: both error replies, with systemd's error name and message.
  const auto not_killed = log_.with(
      "asking systemd to send SIGKILL to every process of gone.service failed: "
      "org.freedesktop.systemd1.NoSuchUnit: Unit gone.service not loaded.");
  ASSERT_EQ(not_killed.size(), 1U) << log_.dump();
  EXPECT_EQ(not_killed[0].priority, Priority::kErr);
  EXPECT_EQ(not_killed[0].fields.resource, "pgdata");
  const auto not_stopped = log_.with(
      "asking systemd to stop gone.service failed: org.freedesktop.systemd1.NoSuchUnit: Unit "
      "gone.service not loaded.");
  ASSERT_EQ(not_stopped.size(), 1U) << log_.dump();
  EXPECT_EQ(not_stopped[0].fields.resource, "pgdata");
}

TEST_F(BusTest, WithNoBusAtAllEveryKillAndStopIsLogged) {
  bus_->kill();  // nothing listens on the address any more
  gate_->act(with_units(OnFencedAction::kKillUnits, {"pg.service"}), key_of(0x6c9d000100000001),
             Gate::Reason::kFenced);
  const auto records = log_.with("cannot ask systemd to");
  ASSERT_EQ(records.size(), 2U) << log_.dump();
  EXPECT_NE(records[0].message.find("send SIGKILL to every process of pg.service: "),
            std::string::npos)
      << records[0].message;
  EXPECT_NE(records[1].message.find("stop pg.service: "), std::string::npos) << records[1].message;
  for (const auto& record : records) {
    EXPECT_EQ(record.priority, Priority::kErr);
    EXPECT_NE(record.message.find("no system bus"), std::string::npos) << record.message;
    EXPECT_EQ(record.fields.resource, "pgdata");
  }
}

TEST_F(BusTest, RebootKillsAndStopsTheUnitsThenStartsRebootTargetAndLogsIt) {
  serve_systemd();
  const auto config = with_units(OnFencedAction::kReboot, {"pg.service"});
  gate_->act(config, key_of(0x6c9d000100000001), Gate::Reason::kFenced);
  const auto records = await("systemd accepted: start reboot.target (job ");
  ASSERT_EQ(records.size(), 1U) << log_.dump();
  EXPECT_EQ(records[0].fields.resource, "pgdata");
  EXPECT_EQ(systemd_->calls(),
            (std::vector<std::string>{"KillUnit pg.service all 9", "StopUnit pg.service replace",
                                      "StartUnit reboot.target replace-irreversibly"}));
}

TEST_F(BusTest, ARebootWithNoBusIsLogged) {
  bus_->kill();
  const auto config = with_units(OnFencedAction::kReboot, {});
  gate_->act(config, key_of(0x6c9d000100000001), Gate::Reason::kFenced);
  const auto records = log_.with("cannot ask systemd to start reboot.target: ");
  ASSERT_EQ(records.size(), 1U) << log_.dump();
  EXPECT_EQ(records[0].priority, Priority::kErr);
  EXPECT_EQ(records[0].fields.resource, "pgdata");
}

TEST_F(BusTest, AfterTheBusRestartsTheNextStopReachesTheNewBus) {
  const auto config = with_units(OnFencedAction::kStopUnits, {"pg.service"});
  gate_->act(config, key_of(0x6c9d000100000001), Gate::Reason::kFenced);
  ASSERT_EQ(await("asking systemd to stop pg.service failed").size(), 1U);
  // As `systemctl restart dbus`: the gate sees its connection close, then a new daemon listens.
  bus_->kill();
  await("lost the connection to the system bus");
  ASSERT_TRUE(bus_->start());
  gate_->act(config, key_of(0x6c9d000100000002), Gate::Reason::kFenced);
  const auto records = await("asking systemd to stop pg.service failed", 2);
  ASSERT_EQ(records.size(), 2U) << log_.dump();
  // An answer from a bus daemon: the new one, since the old one is dead.
  EXPECT_NE(records[1].message.find(kNoSystemd), std::string::npos) << records[1].message;
  EXPECT_EQ(records[1].fields.resource, "pgdata");
  EXPECT_TRUE(log_.with("cannot ask systemd").empty()) << log_.dump();
  // The closed connection was replaced before use: no call was tried on it.
  EXPECT_TRUE(log_.with("the system bus connection broke").empty()) << log_.dump();
}

TEST_F(BusTest, ABreakTheLoopHasNotSeenYetIsRetriedOnANewConnection) {
  const auto config = with_units(OnFencedAction::kStopUnits, {"pg.service"});
  gate_->act(config, key_of(0x6c9d000100000001), Gate::Reason::kFenced);
  ASSERT_EQ(await("asking systemd to stop pg.service failed").size(), 1U);
  // The loop does not run between the restart and the next action: the gate's connection still
  // looks open, and the call's write is what finds it broken.
  bus_->kill();
  ASSERT_TRUE(bus_->start());
  serve_systemd();
  gate_->act(config, key_of(0x6c9d000100000002), Gate::Reason::kFenced);
  const auto records = await("systemd accepted: stop pg.service (job ");
  ASSERT_EQ(records.size(), 1U) << log_.dump();
  EXPECT_EQ(records[0].fields.resource, "pgdata");
  EXPECT_EQ(systemd_->calls(), std::vector<std::string>{"StopUnit pg.service replace"});
  EXPECT_TRUE(log_.with("cannot ask systemd").empty()) << log_.dump();
  // The path this test is about: the write failed on the old connection, the call went again.
  EXPECT_EQ(log_.with("the system bus connection broke").size(), 1U) << log_.dump();
}

TEST_F(BusTest, ACallLeftUnansweredWhenTheBusDiedIsSentAgainOnTheNewBus) {
  serve_systemd("pg.service");  // receives the stop and never answers
  gate_->act(with_units(OnFencedAction::kStopUnits, {"pg.service"}), key_of(0x6c9d000100000001),
             Gate::Reason::kFenced);
  run_until(
      event_, [&] { return !systemd_->calls().empty(); }, "the stop to reach systemd");
  // The bus daemon goes with the call unanswered; a new one (and systemd on it) comes up before
  // the gate's loop runs again.
  bus_->kill();
  systemd_.reset();
  ASSERT_TRUE(bus_->start());
  serve_systemd();
  const auto records = await("systemd accepted: stop pg.service (job ");
  ASSERT_EQ(records.size(), 1U) << log_.dump();
  EXPECT_EQ(records[0].fields.resource, "pgdata");
  EXPECT_EQ(systemd_->calls(), std::vector<std::string>{"StopUnit pg.service replace"});
  const auto warnings = log_.with("broke before systemd answered; asking again to stop pg.service");
  ASSERT_EQ(warnings.size(), 1U) << log_.dump();
  EXPECT_EQ(warnings[0].fields.resource, "pgdata");
  EXPECT_TRUE(log_.with("failed").empty()) << log_.dump();
}

}  // namespace
}  // namespace blkfence::daemon

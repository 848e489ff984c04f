// Proves the guard of blkfencectl's device mode (device_guard.h): every action that sends a PR
// OUT is refused on a LU that a local blkfenced lists among its resources' LUs, while one of its
// resources waits for its devices, and while the daemon does not answer; it proceeds when no daemon
// runs (no socket, or ECONNREFUSED) and when the daemon manages other LUs only; the PR IN actions
// and --force always proceed; the refusal names the device, its WWN, the resource, the socket and
// --force. And ask_daemon(), against sockets in a temporary directory: no socket and a socket
// nobody listens on are "no daemon", a daemon that keeps silent past the bound or answers an error
// cannot tell, and so does a socket that cannot be reached for another reason or a daemon that
// hangs up without an answer; a daemon's status reply gives its resources' LUs.
#include "device_guard.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "blkfence/unique_fd.h"

namespace blkfence::cli {
namespace {

constexpr DeviceAction kReadOnly[] = {DeviceAction::kKeys, DeviceAction::kReservation,
                                      DeviceAction::kStatus, DeviceAction::kCapabilities};
constexpr DeviceAction kPrOut[] = {DeviceAction::kRegister, DeviceAction::kUnregister,
                                   DeviceAction::kReserve,  DeviceAction::kRelease,
                                   DeviceAction::kPreempt,  DeviceAction::kPreemptAbort,
                                   DeviceAction::kClear};

const Target kSdb{.device = "/dev/sdb", .wwn = "naa.6001405b1f0ce0000000000000000000"};
const Target kSdc{.device = "/dev/sdc", .wwn = "naa.6001405b1f0ce0001000000000000000"};

control::ResourceStatus resource(std::string name, const std::vector<std::string>& wwns) {
  control::ResourceStatus status;
  status.name = std::move(name);
  status.mode = "exclusive";
  status.state = "held";
  status.gate_open = true;
  status.key = 0x6c9d000100000007;
  status.epoch = 7;
  for (const auto& wwn : wwns) {
    status.lus.push_back(
        {.wwn = wwn, .devices = {"/dev/sg1"}, .holder = {}, .keys = {}, .error = {}});
  }
  return status;
}

DaemonAnswer answered(std::vector<control::ResourceStatus> resources) {
  return {.kind = DaemonAnswer::Kind::kAnswered, .why = {}, .resources = std::move(resources)};
}

const DaemonAnswer kAbsent{};
const DaemonAnswer kSilent{
    .kind = DaemonAnswer::Kind::kSilent, .why = "did not answer within 2000 ms", .resources = {}};
// The daemon manages /dev/sdb's LU (and another LU that is not a target).
const DaemonAnswer kManagesSdb =
    answered({resource("pgdata", {"naa.6001405ffffffffff000000000000000", kSdb.wwn})});
// The daemon manages other LUs only.
const DaemonAnswer kManagesOthers =
    answered({resource("pgdata", {"naa.6001405ffffffffff000000000000000"})});
// One resource waits for its devices: its status has no LUs.
const DaemonAnswer kWaiting =
    answered({resource("pgdata", {"naa.6001405ffffffffff000000000000000"}), resource("logs", {})});

TEST(DeviceGuardTest, ThePrInActionsNeverAsk) {
  for (const auto action : kReadOnly) {
    EXPECT_FALSE(changes_reservations(action)) << action_name(action);
    for (const auto* daemon : {&kAbsent, &kSilent, &kManagesSdb, &kManagesOthers, &kWaiting}) {
      EXPECT_EQ(judge(action, false, *daemon, {kSdb}).kind, Verdict::Kind::kProceed)
          << action_name(action);
    }
  }
}

TEST(DeviceGuardTest, EveryPrOutIsRefusedOnAManagedLu) {
  for (const auto action : kPrOut) {
    EXPECT_TRUE(changes_reservations(action)) << action_name(action);
    const Verdict verdict = judge(action, false, kManagesSdb, {kSdb});
    EXPECT_EQ(verdict.kind, Verdict::Kind::kManaged) << action_name(action);
    ASSERT_EQ(verdict.managed.size(), 1U) << action_name(action);
    EXPECT_EQ(verdict.managed[0].resource, "pgdata");
    EXPECT_EQ(verdict.managed[0].target.device, "/dev/sdb");
  }
}

TEST(DeviceGuardTest, EveryPrOutProceedsWithoutADaemonOrOnLusItDoesNotManage) {
  for (const auto action : kPrOut) {
    EXPECT_EQ(judge(action, false, kAbsent, {kSdb, kSdc}).kind, Verdict::Kind::kProceed)
        << action_name(action);
    EXPECT_EQ(judge(action, false, kManagesOthers, {kSdb, kSdc}).kind, Verdict::Kind::kProceed)
        << action_name(action);
    EXPECT_EQ(judge(action, false, answered({}), {kSdb}).kind, Verdict::Kind::kProceed)
        << action_name(action) << " against a daemon without resources";
  }
}

TEST(DeviceGuardTest, EveryPrOutFailsClosedWhenTheDaemonCannotTell) {
  for (const auto action : kPrOut) {
    EXPECT_EQ(judge(action, false, kSilent, {kSdb}).kind, Verdict::Kind::kUnanswered)
        << action_name(action);
    const Verdict waiting = judge(action, false, kWaiting, {kSdb});
    EXPECT_EQ(waiting.kind, Verdict::Kind::kWaiting) << action_name(action);
    EXPECT_EQ(waiting.waiting, std::vector<std::string>{"logs"});
  }
}

TEST(DeviceGuardTest, ForceAlwaysProceeds) {
  for (const auto action : kPrOut) {
    for (const auto* daemon : {&kAbsent, &kSilent, &kManagesSdb, &kManagesOthers, &kWaiting}) {
      EXPECT_EQ(judge(action, true, *daemon, {kSdb}).kind, Verdict::Kind::kProceed)
          << action_name(action);
    }
  }
}

TEST(DeviceGuardTest, OnlyTheManagedTargetsAreNamedWhateverTheCaseOfTheirWwn) {
  Target upper = kSdb;
  for (auto& c : upper.wwn) {
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  const Verdict verdict = judge(DeviceAction::kClear, false, kManagesSdb, {kSdc, upper});
  EXPECT_EQ(verdict.kind, Verdict::Kind::kManaged);
  ASSERT_EQ(verdict.managed.size(), 1U);
  EXPECT_EQ(verdict.managed[0].target.device, "/dev/sdb");
  // A managed LU wins over a waiting resource: the refusal names what is known.
  auto both = kWaiting;
  both.resources.push_back(resource("db", {kSdc.wwn}));
  EXPECT_EQ(judge(DeviceAction::kClear, false, both, {kSdc}).kind, Verdict::Kind::kManaged);
}

TEST(DeviceGuardTest, TheRefusalSaysWhatWhereWhoAndHowToOverride) {
  const std::string socket = "/run/blkfence/control.sock";
  const std::string managed =
      refusal_message(DeviceAction::kClear, judge(DeviceAction::kClear, false, kManagesSdb, {kSdb}),
                      kManagesSdb, {kSdb}, socket);
  for (const std::string& part :
       {std::string("device clear refused, nothing sent"), socket, kSdb.device, kSdb.wwn,
        std::string("resource pgdata, state held"), std::string("--force")}) {
    EXPECT_NE(managed.find(part), std::string::npos) << "'" << part << "' not in:\n" << managed;
  }
  const std::string silent =
      refusal_message(DeviceAction::kPreempt, judge(DeviceAction::kPreempt, false, kSilent, {kSdb}),
                      kSilent, {kSdb}, socket);
  for (const std::string& part :
       {std::string("device preempt refused"), socket, std::string("did not answer within 2000 ms"),
        kSdb.wwn, std::string("--force")}) {
    EXPECT_NE(silent.find(part), std::string::npos) << "'" << part << "' not in:\n" << silent;
  }
  const std::string waiting = refusal_message(
      DeviceAction::kRegister, judge(DeviceAction::kRegister, false, kWaiting, {kSdb}), kWaiting,
      {kSdb}, socket);
  for (const std::string& part : {std::string("resource(s) logs waiting for devices"), socket,
                                  kSdb.wwn, std::string("--force")}) {
    EXPECT_NE(waiting.find(part), std::string::npos) << "'" << part << "' not in:\n" << waiting;
  }
  EXPECT_EQ(refusal_message(DeviceAction::kClear, Verdict{}, kAbsent, {kSdb}, socket), "");
}

// --- ask_daemon ---------------------------------------------------------------------------------

class AskDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "blkfence-guard-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    socket_ = dir_ + "/control.sock";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // A socket bound at socket_; listening unless told otherwise.
  UniqueFd bind_socket(bool listen = true) const {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, socket_.c_str(), socket_.size() + 1);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
        (listen && ::listen(fd.get(), 8) != 0)) {
      ADD_FAILURE() << "bind " << socket_ << ": " << std::strerror(errno);
    }
    return fd;
  }

  std::string dir_;
  std::string socket_;
};

// Serves one connection: reads the request line, records it, sends reply, then waits for the
// client to hang up.
std::thread serve_one(const UniqueFd& listener, std::string reply, std::string& request) {
  return std::thread([fd = listener.get(), reply = std::move(reply), &request] {
    const UniqueFd client(::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
    char chunk[4096];
    while (request.find('\n') == std::string::npos) {
      const ssize_t got = ::recv(client.get(), chunk, sizeof chunk, 0);
      if (got <= 0) {
        return;
      }
      request.append(chunk, static_cast<std::size_t>(got));
    }
    (void)::send(client.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
    while (::recv(client.get(), chunk, sizeof chunk, 0) > 0) {
    }
  });
}

TEST_F(AskDaemonTest, NoSocketIsNoDaemon) {
  EXPECT_EQ(ask_daemon(socket_, kDaemonAnswerBound).kind, DaemonAnswer::Kind::kAbsent);
  EXPECT_EQ(ask_daemon(dir_ + "/no-such-dir/control.sock", kDaemonAnswerBound).kind,
            DaemonAnswer::Kind::kAbsent);
}

TEST_F(AskDaemonTest, ASocketNobodyListensOnIsNoDaemon) {
  // A daemon that died leaves its socket file: connect gets ECONNREFUSED.
  const UniqueFd bound = bind_socket(false);
  ASSERT_TRUE(std::filesystem::exists(socket_));
  EXPECT_EQ(ask_daemon(socket_, kDaemonAnswerBound).kind, DaemonAnswer::Kind::kAbsent);
}

TEST_F(AskDaemonTest, ASocketThatCannotBeReachedCannotTell) {
  // Not "no daemon": only a missing socket or ECONNREFUSED says that. (EACCES on the socket's
  // directory is the case in practice; root, which runs the tests, is not refused, so a path too
  // long for a unix socket stands in for it.)
  const DaemonAnswer answer = ask_daemon(dir_ + "/" + std::string(120, 'x'), kDaemonAnswerBound);
  EXPECT_EQ(answer.kind, DaemonAnswer::Kind::kSilent);
  EXPECT_NE(answer.why.find("cannot be reached"), std::string::npos) << answer.why;
}

TEST_F(AskDaemonTest, ADaemonThatHangsUpWithoutAnAnswerCannotTell) {
  const UniqueFd listener = bind_socket();
  std::thread server([fd = listener.get()] {
    // Reads the request first, so that the client's send cannot meet a closed socket instead.
    const UniqueFd client(::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC));
    std::string request;
    char chunk[4096];
    while (request.find('\n') == std::string::npos) {
      const ssize_t got = ::recv(client.get(), chunk, sizeof chunk, 0);
      if (got <= 0) {
        return;
      }
      request.append(chunk, static_cast<std::size_t>(got));
    }
  });
  const DaemonAnswer answer = ask_daemon(socket_, kDaemonAnswerBound);
  server.join();
  EXPECT_EQ(answer.kind, DaemonAnswer::Kind::kSilent);
  EXPECT_NE(answer.why.find("did not answer ("), std::string::npos) << answer.why;
}

TEST_F(AskDaemonTest, ADaemonSilentPastTheBoundCannotTell) {
  // Listening, never accepting or answering: a stopped daemon's socket (SIGSTOP, a frozen loop).
  const UniqueFd listener = bind_socket();
  const DaemonAnswer answer = ask_daemon(socket_, std::chrono::milliseconds(100));
  EXPECT_EQ(answer.kind, DaemonAnswer::Kind::kSilent);
  EXPECT_EQ(answer.why, "did not answer within 100 ms");
}

TEST_F(AskDaemonTest, ADaemonThatAnswersAnErrorCannotTell) {
  const UniqueFd listener = bind_socket();
  std::string request;
  std::thread server = serve_one(
      listener,
      control::encode_error(
          {.id = std::nullopt, .code = control::ReplyError::kBusy, .message = "too many clients"}),
      request);
  const DaemonAnswer answer = ask_daemon(socket_, kDaemonAnswerBound);
  server.join();
  EXPECT_EQ(answer.kind, DaemonAnswer::Kind::kSilent);
  EXPECT_NE(answer.why.find("busy (too many clients)"), std::string::npos) << answer.why;
}

TEST_F(AskDaemonTest, ADaemonsStatusGivesItsResourcesLus) {
  const UniqueFd listener = bind_socket();
  std::string request;
  const auto pgdata = resource("pgdata", {kSdb.wwn});
  std::thread server =
      serve_one(listener,
                control::encode_ok(1, {{"cluster", "pg-prod"},
                                       {"node", 1},
                                       {"resources", nlohmann::json::array({to_json(pgdata)})}}),
                request);
  const DaemonAnswer answer = ask_daemon(socket_, kDaemonAnswerBound);
  server.join();
  ASSERT_EQ(answer.kind, DaemonAnswer::Kind::kAnswered) << answer.why;
  ASSERT_EQ(answer.resources.size(), 1U);
  EXPECT_EQ(answer.resources[0], pgdata);
  const auto sent = control::parse_request(std::string_view(request).substr(0, request.find('\n')));
  ASSERT_TRUE(sent) << request;
  EXPECT_EQ(sent->op, control::Op::kStatus);
  EXPECT_TRUE(sent->resource.empty()) << "the guard must see every resource";
}

}  // namespace
}  // namespace blkfence::cli

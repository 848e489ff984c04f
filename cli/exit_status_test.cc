// Proves blkfencectl's documented exit statuses (blkfencectl --help, docs/blkfencectl.md) by
// running the built program: bad arguments exit 2; no daemon at the socket exits 6; against a fake
// blkfenced in the test (a socket in a temporary directory answering with replies encoded by the
// control library, so they are what the real daemon sends), success exits 0, each error code of
// the protocol maps to its status (conflict 4, indeterminate 5, device 3, permission 7, timeout 8,
// unknown resource and bad request 2, anything else 9), a daemon that hangs up exits 6, --timeout
// passing exits 8, a closed gate exits 1 and `run` exits with its command's status or 4 when the
// gate closes under it; and the device mode exits 2 on bad arguments and 3 on a missing device.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blkfence/control/protocol.h"
#include "blkfence/unique_fd.h"

extern char** environ;

namespace blkfence::cli {
namespace {

using control::ReplyError;

// Far beyond what any case needs on a loaded machine; reaching it fails the test.
constexpr std::chrono::seconds kDeadline{20};

struct Outcome {
  int status = -1;  // the exit status, or -1 when it did not exit normally
  std::string out;
  std::string err;
};

// What the fake daemon does with one request: lines to send (each ending in '\n'), then hang up
// or keep the connection.
struct Answer {
  std::vector<std::string> lines;
  bool hang_up = false;
};
using Responder = std::function<Answer(const control::Request&)>;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class ExitStatusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "blkfence-cli-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    socket_ = dir_ + "/control.sock";
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  // Serves socket_ with respond while blkfencectl runs with args (and extra environment).
  Outcome run(std::vector<std::string> args, const Responder& respond = nullptr,
              const std::vector<std::string>& extra_env = {});

  std::string dir_;
  std::string socket_;
  std::vector<control::Request> requests_;  // what the fake daemon was asked
};

UniqueFd listen_on(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd.get(), 8) != 0) {
    ADD_FAILURE() << "bind " << path << ": " << std::strerror(errno);
  }
  return fd;
}

Outcome ExitStatusTest::run(std::vector<std::string> args, const Responder& respond,
                            const std::vector<std::string>& extra_env) {
  UniqueFd listener;
  if (respond) {
    listener = listen_on(socket_);
  }
  args.insert(args.begin(), BLKFENCECTL);
  std::vector<char*> argv;
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = extra_env;
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "BLKFENCE_SOCKET=", 16) != 0) {
      env.push_back(*e);
    }
  }
  for (auto& e : env_strings) {
    env.push_back(e.data());
  }
  env.push_back(nullptr);
  const std::string out_path = dir_ + "/out";
  const std::string err_path = dir_ + "/err";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    ADD_FAILURE() << "cannot run " << argv[0] << ": " << std::strerror(spawned);
    return {};
  }
  const UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  // The fake daemon: one thread, poll on the listener, its clients and the program's exit.
  struct Client {
    UniqueFd fd;
    std::string in;
  };
  std::vector<Client> clients;
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  bool exited = false;
  while (!exited) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ADD_FAILURE() << "blkfencectl did not exit";
      break;
    }
    std::vector<pollfd> fds{{.fd = pidfd.get(), .events = POLLIN, .revents = 0},
                            {.fd = listener.get(), .events = POLLIN, .revents = 0}};
    for (const auto& c : clients) {
      fds.push_back({.fd = c.fd.get(), .events = POLLIN, .revents = 0});
    }
    if (::poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) {
      ADD_FAILURE() << "poll: " << std::strerror(errno);
      break;
    }
    exited = (fds[0].revents & POLLIN) != 0;
    if ((fds[1].revents & POLLIN) != 0) {
      UniqueFd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (fd.valid()) {
        clients.push_back({.fd = std::move(fd), .in = {}});
      }
    }
    for (std::size_t i = 0; i < clients.size(); ++i) {
      if (i + 2 >= fds.size() || fds[i + 2].revents == 0) {
        continue;
      }
      Client& c = clients[i];
      char chunk[4096];
      const ssize_t got = ::recv(c.fd.get(), chunk, sizeof chunk, MSG_DONTWAIT);
      if (got <= 0) {
        c.fd = UniqueFd();
        continue;
      }
      c.in.append(chunk, static_cast<std::size_t>(got));
      for (auto newline = c.in.find('\n'); newline != std::string::npos && c.fd.valid();
           newline = c.in.find('\n')) {
        const auto request = control::parse_request(std::string_view(c.in).substr(0, newline));
        c.in.erase(0, newline + 1);
        if (!request) {
          ADD_FAILURE() << "blkfencectl sent a bad request: " << request.error().message;
          c.fd = UniqueFd();
          break;
        }
        requests_.push_back(*request);
        const Answer answer = respond(*request);
        for (const auto& line : answer.lines) {
          (void)::send(c.fd.get(), line.data(), line.size(), MSG_NOSIGNAL);
        }
        if (answer.hang_up) {
          c.fd = UniqueFd();
        }
      }
    }
    std::erase_if(clients, [](const Client& c) { return !c.fd.valid(); });
  }
  int wstatus = 0;
  (void)::waitpid(pid, &wstatus, 0);
  listener = UniqueFd();
  (void)::unlink(socket_.c_str());
  return Outcome{.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1,
                 .out = read_file(out_path),
                 .err = read_file(err_path)};
}

Answer ok(const control::Request& request, const nlohmann::json& payload) {
  return {.lines = {control::encode_ok(request.id, payload)}, .hang_up = false};
}
Responder error_reply(ReplyError code) {
  return [code](const control::Request& request) {
    return Answer{.lines = {control::encode_error(
                      {.id = request.id, .code = code, .message = "what the daemon says"})},
                  .hang_up = false};
  };
}

control::ResourceStatus status_of(bool open) {
  control::ResourceStatus status;
  status.name = "pgdata";
  status.mode = "exclusive";
  status.state = open ? "held" : "released";
  status.gate_open = open;
  status.key = 0x6c9d000100000007;
  status.epoch = 7;
  return status;
}

// --- arguments ----------------------------------------------------------------------------------

TEST_F(ExitStatusTest, BadArgumentsExit2) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"no-such-command"},
      {"status", "--no-such-option"},
      {"acquire"},  // RESOURCE is required
      {"status", "--timeout", "soon"},
      {"status", "--timeout", "2h"},  // above the protocol's 1 h
      {"fence", "pgdata", "--node", "0"},
      {"device", "register", "/dev/null"},  // --key is required
      {"device", "reserve", "--key", "xyz", "/dev/null"},
      {"device", "keys", "--type", "exclusive-everything", "/dev/null"},
      {"device", "keys", "--force", "/dev/null"},  // the PR IN actions neither ask nor force
  };
  for (const auto& args : cases) {
    const Outcome result = run(args);
    std::string line;
    for (const auto& a : args) {
      line += a + " ";
    }
    EXPECT_EQ(result.status, 2) << line << "\n" << result.err;
    EXPECT_FALSE(result.err.empty()) << line;
  }
  EXPECT_TRUE(requests_.empty());  // none of them got as far as the daemon
}

TEST_F(ExitStatusTest, HelpExits0AndDocumentsEveryStatus) {
  const Outcome result = run({"--help"});
  EXPECT_EQ(result.status, 0);
  for (int status = 0; status <= 10; ++status) {
    EXPECT_NE(result.out.find("\n  " + std::to_string(status) + "  "), std::string::npos)
        << "exit status " << status << " is not in --help";
  }
}

// --- no daemon ----------------------------------------------------------------------------------

TEST_F(ExitStatusTest, NoDaemonAtTheSocketExits6) {
  for (const char* command : {"status", "metrics", "watch"}) {
    const Outcome result = run({command, "--socket", socket_});
    EXPECT_EQ(result.status, 6) << command << ": " << result.err;
    EXPECT_NE(result.err.find("cannot reach blkfenced"), std::string::npos) << result.err;
  }
  const Outcome by_env = run({"acquire", "pgdata"}, nullptr, {"BLKFENCE_SOCKET=" + socket_});
  EXPECT_EQ(by_env.status, 6) << by_env.err;
  EXPECT_NE(by_env.err.find(socket_), std::string::npos) << by_env.err;
}

TEST_F(ExitStatusTest, ADaemonThatHangsUpWithoutAReplyExits6) {
  const Outcome result =
      run({"acquire", "pgdata", "--socket", socket_},
          [](const control::Request&) { return Answer{.lines = {}, .hang_up = true}; });
  EXPECT_EQ(result.status, 6) << result.err;
  ASSERT_EQ(requests_.size(), 1U);
  EXPECT_EQ(requests_[0].op, control::Op::kAcquire);
  EXPECT_EQ(requests_[0].resource, "pgdata");
}

// --- replies ------------------------------------------------------------------------------------

TEST_F(ExitStatusTest, SuccessExits0) {
  const Outcome status = run({"status", "--socket", socket_}, [](const control::Request& request) {
    return ok(request, {{"cluster", "glue"},
                        {"node", 1},
                        {"resources", nlohmann::json::array({to_json(status_of(true))})}});
  });
  EXPECT_EQ(status.status, 0) << status.err;
  EXPECT_NE(status.out.find("pgdata"), std::string::npos) << status.out;
  const Outcome acquire =
      run({"acquire", "pgdata", "--socket", socket_}, [](const control::Request& request) {
        return ok(request, {{"key", "0x6c9d000100000007"},
                            {"epoch", 7},
                            {"elapsed_ms", 1.5},
                            {"status", to_json(status_of(true))}});
      });
  EXPECT_EQ(acquire.status, 0) << acquire.err;
  EXPECT_NE(acquire.out.find("0x6c9d000100000007"), std::string::npos) << acquire.out;
  // Through $BLKFENCE_SOCKET too.
  const Outcome by_env = run({"metrics"},
                             [](const control::Request& request) {
                               return ok(request, {{"text", "# metrics\n"}});
                             },
                             {"BLKFENCE_SOCKET=" + socket_});
  EXPECT_EQ(by_env.status, 0) << by_env.err;
  EXPECT_EQ(by_env.out, "# metrics\n");
}

TEST_F(ExitStatusTest, EachErrorOfTheDaemonExitsWithItsStatus) {
  const std::map<ReplyError, int> expected{
      {ReplyError::kBadRequest, 2},
      {ReplyError::kUnknownResource, 2},
      {ReplyError::kDevice, 3},
      {ReplyError::kConflict, 4},
      {ReplyError::kIndeterminate, 5},
      {ReplyError::kPermissionDenied, 7},
      {ReplyError::kTimeout, 8},
      {ReplyError::kBusy, 9},
      {ReplyError::kInternal, 9},
      {ReplyError::kTooLarge, 9},
      {ReplyError::kUnsupportedVersion, 9},
  };
  for (const auto& [code, status] : expected) {
    for (const char* command : {"acquire", "status"}) {
      const Outcome result = run({command, "pgdata", "--socket", socket_}, error_reply(code));
      EXPECT_EQ(result.status, status)
          << command << " answered " << control::to_string(code) << ": " << result.err;
      EXPECT_NE(
          result.err.find("what the daemon says (" + std::string(control::to_string(code)) + ")"),
          std::string::npos)
          << result.err;
    }
  }
}

TEST_F(ExitStatusTest, TimeoutPassingBeforeAReplyExits8) {
  // The daemon keeps the connection and never answers.
  const Outcome result = run({"status", "--timeout", "100ms", "--socket", socket_},
                             [](const control::Request&) { return Answer{}; });
  EXPECT_EQ(result.status, 8) << result.err;
  ASSERT_EQ(requests_.size(), 1U);
}

TEST_F(ExitStatusTest, KeysWithAnLuErrorExits3) {
  const Outcome result =
      run({"keys", "pgdata", "--socket", socket_}, [](const control::Request& request) {
        auto status = status_of(true);
        status.lus.push_back({.wwn = "naa.6001405aaaaaaaaa",
                              .devices = {"/dev/sg1"},
                              .holder = std::nullopt,
                              .keys = {},
                              .error = "READ KEYS on /dev/sg1 failed"});
        return ok(request, {{"status", to_json(status)}});
      });
  EXPECT_EQ(result.status, 3) << result.err;
}

// --- the gate -----------------------------------------------------------------------------------

Responder gate_reply(bool open) {
  return [open](const control::Request& request) {
    if (request.op == control::Op::kGate) {
      return ok(request, {{"open", open},
                          {"token", open ? nlohmann::json("0x6c9d000100000007") : nlohmann::json()},
                          {"epoch", 7}});
    }
    return ok(request, {{"resources", nlohmann::json::array({to_json(status_of(open))})}});
  };
}

TEST_F(ExitStatusTest, GateCheckExits0WhenOpenAnd1WhenClosed) {
  const Outcome open = run({"gate", "check", "pgdata", "--socket", socket_}, gate_reply(true));
  EXPECT_EQ(open.status, 0) << open.err;
  const Outcome closed = run({"gate", "check", "pgdata", "--socket", socket_}, gate_reply(false));
  EXPECT_EQ(closed.status, 1) << closed.err;
}

TEST_F(ExitStatusTest, RunExits1WhenTheGateIsClosedAndRunsNothing) {
  const std::string marker = dir_ + "/ran";
  const Outcome result =
      run({"run", "pgdata", "--socket", socket_, "--", "/bin/sh", "-c", "touch " + marker},
          gate_reply(false));
  EXPECT_EQ(result.status, 1) << result.err;
  EXPECT_FALSE(std::filesystem::exists(marker));
}

TEST_F(ExitStatusTest, RunExitsWithTheCommandsOwnStatus) {
  const Outcome result = run({"run", "pgdata", "--socket", socket_, "--", "/bin/sh", "-c",
                              "test \"$BLKFENCE_TOKEN\" = 0x6c9d000100000007 && exit 42"},
                             gate_reply(true));
  EXPECT_EQ(result.status, 42) << result.err;
}

TEST_F(ExitStatusTest, RunExits4WhenTheGateClosesUnderTheCommand) {
  // The watch reply says open, and a fenced event follows at once (in the same read, often: the
  // event must not wait in blkfencectl's buffer); the command would outlive the deadline if it
  // were not killed.
  const Outcome result =
      run({"run", "pgdata", "--socket", socket_, "--", "/bin/sleep", "40"},
          [](const control::Request& request) {
            Answer answer = gate_reply(true)(request);
            auto fenced = status_of(false);
            fenced.state = "fenced";
            answer.lines.push_back(control::encode_event(control::Event::kFenced, fenced));
            return answer;
          });
  EXPECT_EQ(result.status, 4) << result.err;
  EXPECT_NE(result.err.find("killed the command"), std::string::npos) << result.err;
}

TEST_F(ExitStatusTest, RunExits6WhenTheDaemonGoesAway) {
  const Outcome result = run({"run", "pgdata", "--socket", socket_, "--", "/bin/sleep", "40"},
                             [](const control::Request& request) {
                               Answer answer = gate_reply(true)(request);
                               answer.hang_up = true;
                               return answer;
                             });
  EXPECT_EQ(result.status, 6) << result.err;
}

// --- `run` cannot be escaped --------------------------------------------------------------------

// Whether pid has ended: gone, or a zombie nobody reaped yet.
bool ended(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) {
    return true;
  }
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}

// Waits (bounded) until pid has ended.
bool await_end(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!ended(pid)) {
    if (std::chrono::steady_clock::now() > deadline) {
      return false;
    }
    ::poll(nullptr, 0, 10);
  }
  return true;
}

// The pid a command wrote to path (0 when there is none).
pid_t pid_in(const std::string& path) {
  std::ifstream in(path);
  long pid = 0;
  in >> pid;
  return static_cast<pid_t>(pid);
}

// A shell command that starts `sleep 40` in a new session (setsid: out of the command's process
// group, and orphaned when its parent shell goes on), writes its pid to path and waits for that.
std::string escape_to(const std::string& path) {
  return "setsid /bin/sh -c 'echo $$ > " + path + ".new && mv " + path + ".new " + path +
         " && exec sleep 40' </dev/null >/dev/null 2>&1 & while [ ! -s " + path +
         " ]; do sleep 0.01; done";
}

// The gate open with a short lease (so `run` asks every 100 ms), until closes() says otherwise.
Responder gate_until(std::function<bool()> closes) {
  return [closes = std::move(closes)](const control::Request& request) {
    const bool open = !closes();
    if (request.op == control::Op::kGate) {
      return ok(request, {{"open", open},
                          {"token", open ? nlohmann::json("0x6c9d000100000007") : nlohmann::json()},
                          {"epoch", 7},
                          {"lease_ms", 400}});
    }
    return ok(request, {{"resources", nlohmann::json::array({to_json(status_of(open))})}});
  };
}

TEST_F(ExitStatusTest, RunKillsAProcessThatLeftTheCommandsProcessGroupWhenTheGateCloses) {
  const std::string escaped = dir_ + "/escaped";
  const Outcome result = run({"run", "pgdata", "--socket", socket_, "--", "/bin/sh", "-c",
                              escape_to(escaped) + "; exec sleep 40"},
                             gate_until([&] { return pid_in(escaped) != 0; }));
  EXPECT_EQ(result.status, 4) << result.err;
  const pid_t pid = pid_in(escaped);
  ASSERT_NE(pid, 0) << "the command did not start its escaped process";
  EXPECT_TRUE(await_end(pid)) << "pid " << pid << " left the process group and outlived the gate";
}

TEST_F(ExitStatusTest, RunKillsWhatTheCommandLeftBehindWhenItExits) {
  const std::string escaped = dir_ + "/escaped";
  const Outcome result = run({"run", "pgdata", "--socket", socket_, "--", "/bin/sh", "-c",
                              escape_to(escaped) + "; exit 3"},
                             gate_until([] { return false; }));
  EXPECT_EQ(result.status, 3) << result.err;
  const pid_t pid = pid_in(escaped);
  ASSERT_NE(pid, 0);
  EXPECT_TRUE(await_end(pid)) << "pid " << pid << " outlived the command that started it";
}

TEST_F(ExitStatusTest, RunsCommandDiesWhenBlkfencectlIsKilled) {
  // The command kills its parent, blkfencectl, with the one signal it cannot catch.
  const std::string command = dir_ + "/command";
  const Outcome result = run({"run", "pgdata", "--socket", socket_, "--", "/bin/sh", "-c",
                              "echo $$ > " + command + " && kill -KILL $PPID && exec sleep 40"},
                             gate_until([] { return false; }));
  EXPECT_EQ(result.status, -1) << "blkfencectl was not killed: " << result.err;
  const pid_t pid = pid_in(command);
  ASSERT_NE(pid, 0);
  EXPECT_TRUE(await_end(pid)) << "the command outlived blkfencectl run";
}

TEST_F(ExitStatusTest, RunKillsTheCommandWhenTheDaemonStopsAnsweringForTheLease) {
  // A stopped daemon (SIGSTOP, a frozen VM) keeps its socket open and says nothing: the watch
  // reply and the first gate answer come, then nothing more.
  int answered = 0;
  const auto start = std::chrono::steady_clock::now();
  const Outcome result = run({"run", "pgdata", "--socket", socket_, "--", "/bin/sleep", "40"},
                             [&](const control::Request& request) {
                               if (request.op == control::Op::kGate && ++answered > 1) {
                                 return Answer{.lines = {}, .hang_up = false};
                               }
                               return gate_until([] { return false; })(request);
                             });
  EXPECT_EQ(result.status, 6) << result.err;
  EXPECT_NE(result.err.find("did not confirm the gate of pgdata for the lease (400 ms)"),
            std::string::npos)
      << result.err;
  EXPECT_GE(answered, 2) << "run never asked again after the first answer";
  EXPECT_LT(std::chrono::steady_clock::now() - start, kDeadline);
}

// --- the device mode ----------------------------------------------------------------------------

TEST_F(ExitStatusTest, ADeviceThatIsMissingExits3) {
  const Outcome result = run({"device", "keys", dir_ + "/no-such-device"});
  EXPECT_EQ(result.status, 3) << result.err;
  EXPECT_NE(result.err.find("no-such-device"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace blkfence::cli

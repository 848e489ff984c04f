// blkfencectl's daemon commands (cli layer). See daemon_commands.h.
#include "daemon_commands.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blkfence/control/protocol.h"

#include "control_client.h"

namespace blkfence::cli {
namespace {

using control::Op;
using control::Reply;
using control::ReplyError;
using Clock = std::chrono::steady_clock;

int code(DaemonExit exit) {
  return static_cast<int>(exit);
}

std::optional<Clock::time_point> deadline_of(const DaemonOptions& options) {
  if (!options.timeout) {
    return std::nullopt;
  }
  return Clock::now() + *options.timeout;
}

DaemonExit exit_for(ReplyError error) {
  switch (error) {
    case ReplyError::kConflict: return DaemonExit::kConflict;
    case ReplyError::kIndeterminate: return DaemonExit::kIndeterminate;
    case ReplyError::kDevice: return DaemonExit::kDevice;
    case ReplyError::kPermissionDenied: return DaemonExit::kDenied;
    case ReplyError::kTimeout: return DaemonExit::kTimeout;
    case ReplyError::kUnknownResource:
    case ReplyError::kBadRequest: return DaemonExit::kUsage;
    default: return DaemonExit::kFailed;
  }
}

std::string hint_for(ReplyError error, const std::string& resource) {
  switch (error) {
    case ReplyError::kConflict:
      return "another node holds it; see 'blkfencectl status " + resource + "'";
    case ReplyError::kIndeterminate:
      return "the outcome is unknown; read 'blkfencectl status " + resource +
             "' before retrying (retrying an acquire is safe)";
    case ReplyError::kPermissionDenied:
      return "run as root or as a member of the configured control_group";
    case ReplyError::kTimeout:
      return "the daemon goes on; see 'blkfencectl status " + resource + "'";
    default: return "";
  }
}

// Connects and sends; prints why not and sets exit when it fails.
std::optional<ControlClient> open_and_send(const DaemonOptions& options, control::Request request,
                                           int& exit) {
  const std::string path = options.socket.empty() ? default_socket_path() : options.socket;
  auto client = ControlClient::connect(path);
  if (!client) {
    std::cerr << "blkfencectl: cannot reach blkfenced: " << client.error().message()
              << "\n  is it running? 'systemctl status blkfenced' (socket " << path << ")\n";
    exit = code(DaemonExit::kNoDaemon);
    return std::nullopt;
  }
  request.timeout = options.timeout;
  if (auto sent = client->send(request); !sent) {
    std::cerr << "blkfencectl: " << sent.error().message() << '\n';
    exit = code(DaemonExit::kNoDaemon);
    return std::nullopt;
  }
  return std::move(*client);
}

// The reply to our request (skipping events), or an exit status after printing why not.
std::optional<Reply> await_reply(ControlClient& client, std::optional<Clock::time_point> deadline,
                                 const std::string& resource, int& exit) {
  for (;;) {
    auto reply = client.next(deadline);
    if (!reply) {
      const bool timed_out = reply.error().code() == ErrorCode::kIndeterminate;
      std::cerr << "blkfencectl: " << reply.error().message() << '\n';
      exit = code(timed_out ? DaemonExit::kTimeout : DaemonExit::kNoDaemon);
      return std::nullopt;
    }
    if (reply->is_event) {
      continue;
    }
    if (!reply->ok) {
      const auto& error = *reply->error;
      std::cerr << "blkfencectl: " << error.message << " (" << control::to_string(error.code)
                << ")\n";
      if (const std::string hint = hint_for(error.code, resource); !hint.empty()) {
        std::cerr << "  " << hint << '\n';
      }
      exit = code(exit_for(error.code));
      return std::nullopt;
    }
    return std::move(*reply);
  }
}

// One request and its reply: connect, send, await (until deadline). Prints why not and sets exit.
std::optional<Reply> ask(const DaemonOptions& options, Op op, int& exit,
                         std::optional<Clock::time_point> deadline) {
  auto client = open_and_send(
      options,
      {.id = 1, .op = op, .resource = options.resource, .node = options.node, .timeout = {}}, exit);
  if (!client) {
    return std::nullopt;
  }
  return await_reply(*client, deadline, options.resource, exit);
}

std::string key_text(const std::optional<std::uint64_t>& key) {
  return key ? control::format_key(*key) : "-";
}

void print_status(const control::ResourceStatus& s, bool with_lus) {
  std::printf(
      "%-16s %-9s %-12s %-6s %-18s %6u  %s\n", s.name.c_str(), s.mode.c_str(), s.state.c_str(),
      s.gate_open ? "open" : "closed", key_text(s.key).c_str(), s.epoch,
      s.last_check_age_ms ? (std::to_string(*s.last_check_age_ms) + " ms ago").c_str() : "never");
  if (!s.detail.empty()) {
    std::printf("  %s\n", s.detail.c_str());
  }
  if (s.fenced_by) {
    std::printf("  fenced by %s\n", control::format_key(*s.fenced_by).c_str());
  }
  if (!with_lus) {
    return;
  }
  for (const auto& lu : s.lus) {
    std::string devices;
    for (const auto& d : lu.devices) {
      devices += (devices.empty() ? "" : ",") + d;
    }
    std::string keys;
    for (const auto k : lu.keys) {
      keys += (keys.empty() ? "" : " ") + control::format_key(k);
    }
    std::printf("  %-36s %-24s holder %-18s keys %s%s%s\n", lu.wwn.c_str(), devices.c_str(),
                key_text(lu.holder).c_str(), keys.empty() ? "-" : keys.c_str(),
                lu.error.empty() ? "" : "  error: ", lu.error.c_str());
  }
}

void print_header() {
  std::printf("%-16s %-9s %-12s %-6s %-18s %6s  %s\n", "RESOURCE", "MODE", "STATE", "GATE", "KEY",
              "EPOCH", "LAST CHECK");
}

std::optional<control::ResourceStatus> status_from(const nlohmann::json& json) {
  auto status = control::resource_status_from_json(json);
  if (!status) {
    std::cerr << "blkfencectl: unreadable status from blkfenced: " << status.error() << '\n';
    return std::nullopt;
  }
  return *status;
}

}  // namespace

int status_command(const DaemonOptions& options) {
  int exit = 0;
  auto reply = ask(options, Op::kStatus, exit, deadline_of(options));
  if (!reply) {
    return exit;
  }
  if (options.json) {
    std::cout << reply->body.dump(2) << '\n';
    return 0;
  }
  std::printf("cluster %s, node %s\n", reply->body.value("cluster", std::string("?")).c_str(),
              reply->body.contains("node") ? reply->body["node"].dump().c_str() : "?");
  print_header();
  for (const auto& json : reply->body.value("resources", nlohmann::json::array())) {
    if (auto status = status_from(json)) {
      print_status(*status, true);
    }
  }
  return 0;
}

int operation_command(const std::string& op, const DaemonOptions& options) {
  int exit = 0;
  // The daemon answers kTimeout itself at --timeout; allow a little more for its reply.
  std::optional<Clock::time_point> deadline;
  if (options.timeout) {
    deadline = Clock::now() + *options.timeout + std::chrono::seconds(2);
  }
  auto reply = ask(options, *control::op_from_string(op), exit, deadline);
  if (!reply) {
    return exit;
  }
  if (options.json) {
    std::cout << reply->body.dump(2) << '\n';
    return 0;
  }
  const std::string key = reply->body.value("key", std::string());
  if (op == "acquire") {
    std::printf("%s: acquired, token %s, epoch %s\n", options.resource.c_str(), key.c_str(),
                reply->body["epoch"].dump().c_str());
  } else if (op == "promote") {
    std::printf("%s: primary, token %s, epoch %s\n", options.resource.c_str(), key.c_str(),
                reply->body["epoch"].dump().c_str());
  } else if (op == "unfence") {
    std::printf("%s: unfenced, key %s\n", options.resource.c_str(), key.c_str());
  } else if (op == "fence") {
    std::printf("%s: node %u fenced\n", options.resource.c_str(),
                static_cast<unsigned>(*options.node));
  } else {
    std::printf("%s: released %s\n", options.resource.c_str(), key.c_str());
  }
  return 0;
}

int keys_command(const DaemonOptions& options) {
  int exit = 0;
  auto reply = ask(options, Op::kKeys, exit, deadline_of(options));
  if (!reply) {
    return exit;
  }
  if (options.json) {
    std::cout << reply->body.dump(2) << '\n';
    return 0;
  }
  auto status = status_from(reply->body["status"]);
  if (!status) {
    return code(DaemonExit::kFailed);
  }
  int result = 0;
  for (const auto& lu : status->lus) {
    std::printf("%s\n  holder: %s\n", lu.wwn.c_str(), key_text(lu.holder).c_str());
    for (const auto k : lu.keys) {
      std::printf("  key:    %s\n", control::format_key(k).c_str());
    }
    if (!lu.error.empty()) {
      std::printf("  error:  %s\n", lu.error.c_str());
      result = code(DaemonExit::kDevice);
    }
  }
  return result;
}

int metrics_command(const DaemonOptions& options) {
  int exit = 0;
  auto reply = ask(options, Op::kMetrics, exit, deadline_of(options));
  if (!reply) {
    return exit;
  }
  std::cout << reply->body.value("text", std::string());
  return 0;
}

int watch_command(const DaemonOptions& options) {
  int exit = 0;
  auto client = open_and_send(
      options, {.id = 1, .op = Op::kWatch, .resource = options.resource, .node = {}, .timeout = {}},
      exit);
  if (!client) {
    return exit;
  }
  const auto deadline = deadline_of(options);
  auto first = await_reply(*client, deadline, options.resource, exit);
  if (!first) {
    return exit;
  }
  if (options.json) {
    std::cout << first->body.dump() << std::endl;
  } else {
    print_header();
    for (const auto& json : first->body.value("resources", nlohmann::json::array())) {
      if (auto status = status_from(json)) {
        print_status(*status, false);
      }
    }
  }
  for (;;) {
    auto event = client->next(deadline);
    if (!event) {
      if (event.error().code() == ErrorCode::kIndeterminate) {
        return 0;  // --timeout: watched as long as asked
      }
      std::cerr << "blkfencectl: " << event.error().message() << '\n';
      return code(DaemonExit::kNoDaemon);
    }
    if (options.json) {
      std::cout << event->body.dump() << std::endl;
      continue;
    }
    if (auto status = status_from(event->body["status"])) {
      std::printf("%s: ", event->body.value("event", std::string("?")).c_str());
      print_status(*status, false);
      (void)std::fflush(stdout);
    }
  }
}

namespace {

// Watches the resource until its gate is open; the token and epoch, or an exit status.
struct Opened {
  std::string token;
  std::uint32_t epoch = 0;
};
std::optional<Opened> wait_open(ControlClient& client, const DaemonOptions& options, bool wait,
                                int& exit) {
  const auto deadline = deadline_of(options);
  auto first = await_reply(client, deadline, options.resource, exit);
  if (!first) {
    return std::nullopt;
  }
  std::optional<control::ResourceStatus> status;
  for (const auto& json : first->body.value("resources", nlohmann::json::array())) {
    status = status_from(json);
  }
  while (status && !(status->gate_open && status->key)) {
    if (!wait) {
      std::cerr << "blkfencectl: the gate of " << options.resource << " is closed (state "
                << status->state << ")\n";
      exit = code(DaemonExit::kClosed);
      return std::nullopt;
    }
    auto event = client.next(deadline);
    if (!event) {
      const bool timed_out = event.error().code() == ErrorCode::kIndeterminate;
      std::cerr << "blkfencectl: "
                << (timed_out ? "the gate of " + options.resource + " did not open before --timeout"
                              : event.error().message())
                << '\n';
      exit = code(timed_out ? DaemonExit::kTimeout : DaemonExit::kNoDaemon);
      return std::nullopt;
    }
    if (event->is_event) {
      status = status_from(event->body["status"]);
    }
  }
  if (!status) {
    exit = code(DaemonExit::kFailed);
    return std::nullopt;
  }
  return Opened{.token = control::format_key(*status->key), .epoch = status->epoch};
}

}  // namespace

int gate_check_command(const DaemonOptions& options) {
  int exit = 0;
  auto reply = ask(options, Op::kGate, exit, deadline_of(options));
  if (!reply) {
    return exit;
  }
  const bool open = reply->body.value("open", false);
  if (options.json) {
    std::cout << reply->body.dump(2) << '\n';
  } else if (open) {
    std::printf("%s: open, token %s\n", options.resource.c_str(),
                reply->body.value("token", std::string()).c_str());
  } else {
    (void)std::fprintf(stderr, "%s: closed\n", options.resource.c_str());
  }
  return open ? 0 : code(DaemonExit::kClosed);
}

int gate_wait_command(const DaemonOptions& options) {
  int exit = 0;
  auto client = open_and_send(
      options, {.id = 1, .op = Op::kWatch, .resource = options.resource, .node = {}, .timeout = {}},
      exit);
  if (!client) {
    return exit;
  }
  auto opened = wait_open(*client, options, true, exit);
  if (!opened) {
    return exit;
  }
  std::printf("%s\n", opened->token.c_str());
  return 0;
}

namespace {

// A resource's lease until blkfenced's first answer names it (blkfence.toml's default).
constexpr std::chrono::milliseconds kDefaultLease{5000};

// Every living process descended from us (our pid and zombies excluded), read from /proc: the
// command, whatever it started, and orphans re-parented to us as the subreaper.
std::vector<pid_t> descendants() {
  std::map<pid_t, std::vector<std::pair<pid_t, char>>> children;  // ppid -> (pid, state)
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    std::ifstream stat(entry.path() / "stat");
    std::string text;
    std::getline(stat, text);
    // pid (comm) state ppid ...: comm may hold spaces and parentheses; the last ')' ends it.
    const auto close = text.rfind(')');
    if (close == std::string::npos) {
      continue;
    }
    std::istringstream rest(text.substr(close + 1));
    char state = 0;
    pid_t ppid = 0;
    if (rest >> state >> ppid) {
      children[ppid].emplace_back(static_cast<pid_t>(std::stol(name)), state);
    }
  }
  std::vector<pid_t> found;
  std::vector<pid_t> queue{::getpid()};
  while (!queue.empty()) {
    const pid_t parent = queue.back();
    queue.pop_back();
    for (const auto& [child, state] : children[parent]) {
      if (state != 'Z') {  // a zombie is dead, and has no children left
        found.push_back(child);
        queue.push_back(child);
      }
    }
  }
  return found;
}

// SIGKILLs the command's process group and every descendant, again until none is left (a process
// may fork while we look), reaping the orphans that were re-parented to us.
void kill_every_descendant(pid_t command) {
  ::kill(-command, SIGKILL);
  for (int round = 0; round < 100; ++round) {
    const std::vector<pid_t> alive = descendants();
    for (const pid_t pid : alive) {
      ::kill(pid, SIGKILL);
    }
    // Orphans that died are our zombies now. (The command itself may be reaped here too; its
    // status does not matter once it has been killed.)
    int status = 0;
    while (::waitpid(-1, &status, WNOHANG | __WALL) > 0) {
    }
    if (alive.empty()) {
      return;
    }
    std::this_thread::yield();
  }
}

}  // namespace

int run_command(const DaemonOptions& options, const std::vector<std::string>& argv) {
  int exit = 0;
  auto client = open_and_send(
      options, {.id = 1, .op = Op::kWatch, .resource = options.resource, .node = {}, .timeout = {}},
      exit);
  if (!client) {
    return exit;
  }
  // Without --timeout the gate must be open now; with it, wait that long for it to open.
  auto opened = wait_open(*client, options, options.timeout.has_value(), exit);
  if (!opened) {
    return exit;
  }
  const auto token = control::parse_key(opened->token);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigset_t old;
  sigprocmask(SIG_BLOCK, &signals, &old);
  // Whatever the command starts stays ours to kill: a process that leaves the command's process
  // group (setsid) and is orphaned (a double fork) is re-parented to us, not to init.
  (void)::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    std::cerr << "blkfencectl: fork: " << std::strerror(errno) << '\n';
    return code(DaemonExit::kFailed);
  }
  if (child == 0) {
    // Should blkfencectl itself be killed (SIGKILL cannot be caught), the command goes with it.
    (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) {
      ::_exit(127);  // it died before the line above
    }
    ::setpgid(0, 0);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    ::close(client->fd());
    ::setenv("BLKFENCE_TOKEN", opened->token.c_str(), 1);
    ::setenv("BLKFENCE_EPOCH", std::to_string(opened->epoch).c_str(), 1);
    ::setenv("BLKFENCE_RESOURCE", options.resource.c_str(), 1);
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const auto& a : argv) {
      args.push_back(const_cast<char*>(a.c_str()));
    }
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    (void)std::fprintf(stderr, "blkfencectl: cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(child, child);  // both sides, so it holds whichever runs first
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
  // TERM/INT/HUP go to the command's group instead of killing us and leaving it running.
  const int sigfd = ::signalfd(-1, &signals, SFD_CLOEXEC);
  const auto kill_all = [&](const std::string& why) {
    kill_every_descendant(child);
    (void)std::fprintf(stderr, "blkfencectl run: %s: killed the command (process group %d)\n",
                       why.c_str(), child);
  };
  // The heartbeat: a `gate` request every quarter lease on the watch connection. A daemon that
  // is stopped (SIGSTOP, a frozen VM) sends no event and closes nothing, so without an answer that
  // confirms the gate within the lease the command is killed. The lease comes with each answer.
  auto lease = kDefaultLease;
  Clock::time_point confirmed = Clock::now();  // the watch reply just showed the gate open
  Clock::time_point next_ask = confirmed;
  std::optional<std::pair<std::uint64_t, Clock::time_point>> asked;  // id, when
  std::uint64_t next_id = 2;
  int result = -1;
  while (result < 0) {
    const auto now = Clock::now();
    if (!asked && now >= next_ask) {
      const std::uint64_t id = next_id++;
      if (auto sent = client->send(
              {.id = id, .op = Op::kGate, .resource = options.resource, .node = {}, .timeout = {}});
          !sent) {
        kill_all("lost blkfenced");
        result = code(DaemonExit::kNoDaemon);
        break;
      }
      asked = {id, now};
      next_ask = now + lease / 4;
    }
    const auto wake = asked ? confirmed + lease : std::min(confirmed + lease, next_ask);
    const int wait_ms = static_cast<int>(std::max<std::int64_t>(
        0, std::chrono::ceil<std::chrono::milliseconds>(wake - now).count()));
    // An event that came in one read with the reply (or another event) is in the client's buffer
    // already: poll() would wait on the socket for something else while the gate is closed.
    const bool buffered = client->has_line();
    pollfd fds[3] = {{.fd = client->fd(), .events = POLLIN, .revents = 0},
                     {.fd = pidfd, .events = POLLIN, .revents = 0},
                     {.fd = sigfd, .events = POLLIN, .revents = 0}};
    if (::poll(fds, 3, buffered ? 0 : wait_ms) < 0 && errno != EINTR) {
      kill_all("poll failed");
      result = code(DaemonExit::kFailed);
      break;
    }
    if ((fds[2].revents & POLLIN) != 0) {
      signalfd_siginfo info{};
      if (::read(sigfd, &info, sizeof info) == sizeof info) {
        ::kill(-child, static_cast<int>(info.ssi_signo));
      }
    }
    if (buffered || (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      auto line = client->next(Clock::now());
      if (!line && line.error().code() != ErrorCode::kIndeterminate) {
        // Fail closed: without the daemon nothing vouches for the token any more.
        kill_all("lost blkfenced");
        result = code(DaemonExit::kNoDaemon);
        break;
      }
      std::optional<std::string> closed;  // why the gate is no longer ours
      if (line && line->is_event) {
        auto status = status_from(line->body["status"]);
        if (status && (!status->gate_open || status->key != token)) {
          closed = "the gate of " + options.resource + " closed (" + status->state + ")";
        }
      } else if (line && asked && line->id == asked->first) {
        if (!line->ok || !line->body.value("open", false) ||
            control::parse_key(line->body.value("token", std::string())) != token) {
          closed = "the gate of " + options.resource + " is no longer open with our token";
        } else {
          // Open when the daemon answered, so at least since we asked.
          confirmed = asked->second;
          if (const auto ms = line->body.value("lease_ms", 0); ms > 0) {
            lease = std::chrono::milliseconds(ms);
          }
          next_ask = confirmed + lease / 4;
        }
        asked.reset();
      }
      if (closed) {
        kill_all(*closed);
        result = code(DaemonExit::kConflict);
        break;
      }
    }
    if ((fds[1].revents & POLLIN) != 0) {
      int wstatus = 0;
      if (::waitpid(child, &wstatus, WNOHANG) == child) {
        result = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        // The command is done; nothing it started may write on without it.
        kill_every_descendant(child);
        return result;
      }
    }
    // After everything that is waiting is read: a run that was stopped itself reads what the
    // daemon said meanwhile (an answer from before the stop, then the fenced event) first.
    pollfd more{.fd = client->fd(), .events = POLLIN, .revents = 0};
    if (client->has_line() || ::poll(&more, 1, 0) > 0) {
      continue;
    }
    if (Clock::now() - confirmed >= lease) {
      kill_all(
          "blkfenced did not confirm the gate of " + options.resource + " for the lease (" +
          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(lease).count()) +
          " ms)");
      result = code(DaemonExit::kNoDaemon);
    }
  }
  int wstatus = 0;
  (void)::waitpid(child, &wstatus, 0);
  return result;
}

}  // namespace blkfence::cli

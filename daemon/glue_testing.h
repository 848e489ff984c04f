// Helpers for the daemon glue's unit tests (tests only): a temporary directory, an sd-event loop
// run until a condition holds, and a raw client of a unix stream socket whose reads run the loop
// (the server under test and its client share the test's one thread); for the gate, a capture of
// log records, a private dbus-daemon and a fake systemd on it. Every wait is bounded by kDeadline
// and reported as a test failure, never a hang. One thread.
#pragma once

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "blkfence/unique_fd.h"

#include "log.h"

namespace blkfence::daemon::testing {

// Far beyond anything these tests wait for on a loaded two-core machine; reaching it is a failure.
inline constexpr std::chrono::seconds kDeadline{20};

class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "blkfence-glue-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs event's loop until done() holds (true) or kDeadline passes (false, and a test failure).
inline bool run_until(sd_event* event, const std::function<bool()>& done, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "gave up waiting for: " << what;
      return false;
    }
    // Waits for the next event, at most 10 ms, so that done() is asked again when a condition
    // outside the loop (another process, a client socket) is what changed.
    const int r = sd_event_run(event, 10'000);
    if (r < 0) {
      ADD_FAILURE() << "sd_event_run: " << std::strerror(-r);
      return false;
    }
  }
  return true;
}

// A raw client: what any program can do with the socket, no protocol library involved.
class RawClient {
 public:
  RawClient(sd_event* event, const std::string& path) : event_(event) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    connected_ =
        ::connect(fd_.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
    if (!connected_) {
      ADD_FAILURE() << "connect " << path << ": " << std::strerror(errno);
    }
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_.get(); }

  void write(const std::string& bytes) {
    if (!try_write(bytes)) {
      ADD_FAILURE() << "send: " << std::strerror(errno);
    }
  }
  // False when the server has closed the connection (EPIPE, ECONNRESET) or another error.
  bool try_write(const std::string& bytes) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_.get(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0) {
        return false;
      }
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }
  void close() { fd_ = UniqueFd(); }

  // The next line (without '\n'), running the loop while it is not there; nullopt at EOF (or
  // after kDeadline, a failure).
  std::optional<std::string> read_line() {
    std::optional<std::string> line;
    run_until(
        event_,
        [&] {
          if (take_line(line)) {
            return true;
          }
          fill();
          return take_line(line) || eof_;
        },
        "a line from the server");
    return line;
  }
  // True once the server has closed the connection (after whatever it sent), running the loop.
  bool await_eof() {
    return run_until(
        event_,
        [&] {
          fill();
          return eof_;
        },
        "the server to close the connection");
  }
  // Everything received so far and not taken as a line.
  const std::string& unread() const { return buffer_; }

 private:
  bool take_line(std::optional<std::string>& line) {
    const auto newline = buffer_.find('\n');
    if (newline == std::string::npos) {
      return false;
    }
    line = buffer_.substr(0, newline);
    buffer_.erase(0, newline + 1);
    return true;
  }
  void fill() {
    while (!eof_) {
      char chunk[65536];
      const ssize_t got = ::recv(fd_.get(), chunk, sizeof chunk, MSG_DONTWAIT);
      if (got > 0) {
        buffer_.append(chunk, static_cast<std::size_t>(got));
        continue;
      }
      if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        eof_ = true;  // ECONNRESET too: the server dropped us with our data unread
      }
      return;
    }
  }

  sd_event* event_;
  UniqueFd fd_;
  bool connected_ = false;
  bool eof_ = false;
  std::string buffer_;
};

// --- log records and a private system bus (gate_test.cc) ----------------------------------------

// Every record logged while it lives, instead of stderr (log.h's test sink).
class LogCapture {
 public:
  struct Record {
    Priority priority;
    std::string message;
    LogFields fields;  // message_id empty: see below
    std::string message_id;
  };
  LogCapture() {
    (void)flush_log(kFlushWait);  // nothing logged before it was made
    set_log_sink_for_testing(
        [this](Priority priority, const std::string& message, const LogFields& fields) {
          Record record{.priority = priority,
                        .message = message,
                        .fields = fields,
                        .message_id = std::string(fields.message_id)};
          record.fields.message_id = {};  // the writer's copy goes when the sink returns
          const std::lock_guard lock(mutex_);
          records_.push_back(std::move(record));
        });
  }
  ~LogCapture() {
    (void)flush_log(kFlushWait);
    set_log_sink_for_testing({});
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Every record logged so far (the log's thread writes them: this waits for it).
  std::vector<Record> records() const {
    (void)flush_log(kFlushWait);
    const std::lock_guard lock(mutex_);
    return records_;
  }
  // The records whose message contains text.
  std::vector<Record> with(const std::string& text) const {
    std::vector<Record> found;
    for (const auto& record : records()) {
      if (record.message.find(text) != std::string::npos) {
        found.push_back(record);
      }
    }
    return found;
  }
  // Every message, one a line, for a failure's report.
  std::string dump() const {
    std::string text;
    for (const auto& record : records()) {
      text += "<" + std::to_string(static_cast<int>(record.priority)) + "> " + record.message +
              " resource=" + record.fields.resource + "\n";
    }
    return text;
  }

 private:
  static constexpr std::chrono::seconds kFlushWait{10};  // a failure well before
  mutable std::mutex mutex_;
  std::vector<Record> records_;
};

// A dbus-daemon of the test's own, listening on DIR/bus and allowing everything; stopped with
// SIGKILL (as a crash would) and started again on the same address. Nothing provides
// org.freedesktop.systemd1 on it unless a FakeSystemd does.
class PrivateBus {
 public:
  static constexpr const char* kProgram = "/usr/bin/dbus-daemon";

  explicit PrivateBus(const std::string& dir) : socket_(dir + "/bus"), config_(dir + "/bus.conf") {
    std::ofstream(config_) << "<!DOCTYPE busconfig PUBLIC "
                              "\"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\"\n"
                              " \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
                              "<busconfig>\n"
                              "  <listen>unix:path="
                           << socket_
                           << "</listen>\n"
                              "  <auth>EXTERNAL</auth>\n"
                              "  <policy context=\"default\">\n"
                              "    <allow send_destination=\"*\"/>\n"
                              "    <allow receive_sender=\"*\"/>\n"
                              "    <allow own=\"*\"/>\n"
                              "  </policy>\n"
                              "</busconfig>\n";
  }
  ~PrivateBus() { kill(); }
  PrivateBus(const PrivateBus&) = delete;
  PrivateBus& operator=(const PrivateBus&) = delete;

  // Without a guid: a new daemon on the same socket has another one, as after a restart of the
  // host's bus, whose clients know only /run/dbus/system_bus_socket.
  std::string address() const { return "unix:path=" + socket_; }

  // Starts the daemon and returns once it listens: it prints its address only then.
  bool start() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2: " << std::strerror(errno);
      return false;
    }
    const UniqueFd from_daemon(fds[0]);
    UniqueFd to_test(fds[1]);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to_test.get(), 3);  // dup2 clears O_CLOEXEC
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t empty;
    sigemptyset(&empty);
    posix_spawnattr_setsigmask(&attributes, &empty);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
    std::string config_option = "--config-file=" + config_;
    std::vector<char*> argv{const_cast<char*>(kProgram), config_option.data(),
                            const_cast<char*>("--nofork"), const_cast<char*>("--print-address=3"),
                            nullptr};
    const int r = posix_spawn(&pid_, kProgram, &actions, &attributes, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (r != 0) {
      pid_ = 0;
      ADD_FAILURE() << "posix_spawn " << kProgram << ": " << std::strerror(r);
      return false;
    }
    to_test.reset();  // the daemon's copy only: EOF if it exits before it listens
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + kDeadline;
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd wait{.fd = from_daemon.get(), .events = POLLIN, .revents = 0};
      if (left.count() <= 0 || ::poll(&wait, 1, static_cast<int>(left.count())) <= 0) {
        ADD_FAILURE() << "dbus-daemon did not print its address";
        return false;
      }
      char chunk[256];
      const ssize_t got = ::read(from_daemon.get(), chunk, sizeof chunk);
      if (got <= 0) {
        ADD_FAILURE() << "dbus-daemon exited before it listened";
        return false;
      }
      line.append(chunk, static_cast<std::size_t>(got));
    }
    return true;
  }

  // SIGKILL, then reaped: once this returns, the daemon and its end of every connection are gone.
  void kill() {
    if (pid_ > 0) {
      (void)::kill(pid_, SIGKILL);
      (void)::waitpid(pid_, nullptr, 0);
      pid_ = 0;
    }
  }

 private:
  std::string socket_;
  std::string config_;
  pid_t pid_ = 0;
};

// org.freedesktop.systemd1 on a PrivateBus, served on event's loop: it records each call to its
// manager ("StopUnit pg.service replace", "KillUnit pg.service all 9") and answers StopUnit and
// StartUnit with a job, KillUnit with nothing, any call for "gone.service" with NoSuchUnit, and
// none for the unit unanswered (as a bus daemon that exits before passing the call on).
class FakeSystemd {
 public:
  FakeSystemd(sd_event* event, const std::string& address, std::string unanswered = {})
      : unanswered_(std::move(unanswered)) {
    if (sd_bus_new(&bus_) < 0 || sd_bus_set_address(bus_, address.c_str()) < 0 ||
        sd_bus_set_bus_client(bus_, 1) < 0 || sd_bus_start(bus_) < 0 ||
        sd_bus_request_name(bus_, "org.freedesktop.systemd1", 0) < 0 ||
        sd_bus_add_object(bus_, nullptr, "/org/freedesktop/systemd1", on_call, this) < 0 ||
        sd_bus_attach_event(bus_, event, SD_EVENT_PRIORITY_NORMAL) < 0) {
      ADD_FAILURE() << "cannot serve org.freedesktop.systemd1 on " << address;
    }
  }
  ~FakeSystemd() {
    (void)sd_bus_detach_event(bus_);
    sd_bus_flush_close_unref(bus_);
  }
  FakeSystemd(const FakeSystemd&) = delete;
  FakeSystemd& operator=(const FakeSystemd&) = delete;

  const std::vector<std::string>& calls() const { return calls_; }

 private:
  static int on_call(sd_bus_message* call, void* userdata, sd_bus_error* error) {
    auto* self = static_cast<FakeSystemd*>(userdata);
    if (sd_bus_message_is_method_call(call, "org.freedesktop.systemd1.Manager", nullptr) <= 0) {
      return 0;
    }
    const std::string method = sd_bus_message_get_member(call);
    const char* unit = nullptr;
    const char* mode = nullptr;
    if (sd_bus_message_read(call, "ss", &unit, &mode) < 0) {
      return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "expected a unit and a mode");
    }
    std::string recorded = method + " " + unit + " " + mode;
    std::int32_t signal = 0;
    if (method == "KillUnit") {
      if (sd_bus_message_read(call, "i", &signal) < 0) {
        return sd_bus_error_set(error, SD_BUS_ERROR_INVALID_ARGS, "expected a signal");
      }
      recorded += " " + std::to_string(signal);
    }
    self->calls_.push_back(recorded);
    if (unit == self->unanswered_) {
      return 1;  // handled: sd-bus sends nothing
    }
    if (std::string(unit) == "gone.service") {
      return sd_bus_error_setf(error, "org.freedesktop.systemd1.NoSuchUnit", "Unit %s not loaded.",
                               unit);
    }
    if (method == "KillUnit") {
      return sd_bus_reply_method_return(call, nullptr);
    }
    const std::string job = "/org/freedesktop/systemd1/job/" + std::to_string(self->calls_.size());
    return sd_bus_reply_method_return(call, "o", job.c_str());
  }

  std::string unanswered_;
  sd_bus* bus_ = nullptr;
  std::vector<std::string> calls_;
};

}  // namespace blkfence::daemon::testing

// Helpers for the daemon glue's unit tests (tests only): a temporary directory, an sd-event loop
// run until a condition holds, and a raw client of a unix stream socket whose reads run the loop
// (the server under test and its client share the test's one thread), and a capture of log
// records. Every wait is bounded by kDeadline and reported as a test failure, never a hang. One
// thread.
#pragma once

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
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

// --- log records (gate_test.cc) ----------------------------------------------------------------

// Every record logged while it lives, instead of stderr (log.h's test sink).
class LogCapture {
 public:
  struct Record {
    Priority priority;
    std::string message;
    LogFields fields;
  };
  LogCapture() {
    set_log_sink_for_testing(
        [this](Priority priority, const std::string& message, const LogFields& fields) {
          records_.push_back(Record{.priority = priority, .message = message, .fields = fields});
        });
  }
  ~LogCapture() { set_log_sink_for_testing({}); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  const std::vector<Record>& records() const { return records_; }
  // The records whose message contains text.
  std::vector<Record> with(const std::string& text) const {
    std::vector<Record> found;
    for (const auto& record : records_) {
      if (record.message.find(text) != std::string::npos) {
        found.push_back(record);
      }
    }
    return found;
  }
  // Every message, one a line, for a failure's report.
  std::string dump() const {
    std::string text;
    for (const auto& record : records_) {
      text += "<" + std::to_string(static_cast<int>(record.priority)) + "> " + record.message +
              " resource=" + record.fields.resource + "\n";
    }
    return text;
  }

 private:
  std::vector<Record> records_;
};

}  // namespace blkfence::daemon::testing

// A blkfenced on a simulated target, for the daemon's tests and the abuse harness (tests only): a
// DaemonEnv whose transport is a PacedSimTransport over a SimTarget with one LU per configured
// device, so that a real Daemon runs its protocol, its control socket and its timers without a
// device; a DaemonThread that runs it (Daemon::run(), its own loop) on a thread of its own; and a
// LineClient that talks to it with blocking, deadline-bounded reads from any other thread. The
// target and the transport are touched only from the daemon's thread; TransportStats (counters,
// and a log of every command as it reached the target) may be read from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include "blkfence/testing/sim_clock.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/testing/sim_transport.h"
#include "blkfence/unique_fd.h"

#include "daemon.h"

namespace blkfence::daemon::testing {

// One command as it reached the target.
struct CommandRecord {
  std::chrono::steady_clock::time_point at;
  std::string device;
  std::uint8_t opcode = 0;          // 5Eh PERSISTENT RESERVE IN, 5Fh PERSISTENT RESERVE OUT, ...
  std::uint8_t service_action = 0;  // CDB byte 1, bits 4..0
  std::uint64_t key = 0;            // PR OUT: RESERVATION KEY of the parameter list
  std::uint64_t sa_key = 0;         // PR OUT: SERVICE ACTION RESERVATION KEY

  static constexpr std::uint8_t kPrIn = 0x5e;
  static constexpr std::uint8_t kPrOut = 0x5f;
  // A PR OUT that could give its key the LU: a RESERVE, a PREEMPT (AND ABORT), or a REGISTER (AND
  // IGNORE EXISTING KEY) of a new key. An unregister (REGISTER with service action key 0), a
  // RELEASE or a CLEAR cannot.
  bool could_take() const {
    if (opcode != kPrOut) {
      return false;
    }
    switch (service_action) {
      case 0x00:                      // REGISTER
      case 0x06:                      // REGISTER AND IGNORE EXISTING KEY
      case 0x07: return sa_key != 0;  // REGISTER AND MOVE
      case 0x01:                      // RESERVE
      case 0x04:                      // PREEMPT
      case 0x05: return true;         // PREEMPT AND ABORT
      default: return false;
    }
  }
};

// What the device saw, readable from any thread.
struct TransportStats {
  std::atomic<std::uint64_t> commands{0};
  std::atomic<std::size_t> in_flight{0};
  std::atomic<std::size_t> in_flight_max{0};

  void record(CommandRecord command) {
    {
      const std::lock_guard lock(mutex_);
      log_.push_back(std::move(command));
    }
    changed_.notify_all();
  }
  // Every command so far, in the order they reached the target.
  std::vector<CommandRecord> log() const {
    const std::lock_guard lock(mutex_);
    return log_;
  }
  // Waits until one command satisfies pred, at most wait; that command, or nullopt.
  template <typename Pred>
  std::optional<CommandRecord> await(Pred pred, std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    std::optional<CommandRecord> found;
    (void)changed_.wait_for(lock, wait, [&] {
      const auto it = std::find_if(log_.begin(), log_.end(), pred);
      if (it != log_.end()) {
        found = *it;
      }
      return found.has_value();
    });
    return found;
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<CommandRecord> log_;
};

// A transport over a SimTarget that answers in real time, as a device serving one command at a
// time would: each command executes on the target when it is submitted (its simulated latency
// passes on the target's own clock), and its completion is delivered `latency` of real time after
// the previous completion (or after its submission, when the device was idle). A flood of commands
// so queues up in front of the monitor's as it would on a real LU. poll_fd() is a timerfd armed
// for the next delivery.
class PacedSimTransport final : public transport::Transport {
 public:
  PacedSimTransport(transport::SimTarget& target, std::chrono::microseconds latency,
                    TransportStats& stats)
      : latency_(latency),
        stats_(stats),
        timer_(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) {
    auto made = transport::SimTransport::make(target);
    if (made) {
      inner_ = std::move(*made);
    }
  }

  Result<transport::PathId> open_path(const std::string& device) override {
    auto opened = inner_->open_path(device);
    if (opened) {
      devices_[*opened] = device;
    }
    return opened;
  }
  void close_path(transport::PathId path) override { inner_->close_path(path); }

  Result<void> submit(transport::PathId path, transport::Command command) override {
    CommandRecord record = record_of(path, command);
    if (auto submitted = inner_->submit(path, std::move(command)); !submitted) {
      return submitted;
    }
    // The command executed on the target inside submit: it has reached it now.
    record.at = std::chrono::steady_clock::now();
    stats_.record(std::move(record));
    std::vector<transport::Completion> done;
    // The simulated clock runs until the answer is back: nothing else is in flight inside.
    while (done.empty()) {
      if (auto reaped = inner_->reap(std::chrono::seconds(60), done); !reaped) {
        return tl::unexpected(reaped.error());
      }
    }
    const auto now = std::chrono::steady_clock::now();
    const auto due = std::max(now, last_due_) + latency_;
    last_due_ = due;
    for (auto& completion : done) {
      queue_.push_back({due, std::move(completion)});
    }
    ++stats_.commands;
    count_in_flight();
    arm();
    return {};
  }

  Result<std::size_t> reap(std::chrono::milliseconds,
                           std::vector<transport::Completion>& out) override {
    std::uint64_t expirations = 0;
    (void)::read(timer_.get(), &expirations, sizeof expirations);
    const auto now = std::chrono::steady_clock::now();
    std::size_t count = 0;
    while (!queue_.empty() && queue_.front().due <= now) {
      out.push_back(std::move(queue_.front().completion));
      queue_.pop_front();
      ++count;
    }
    count_in_flight();
    arm();
    return count;
  }

  std::size_t in_flight() const override { return queue_.size(); }
  int poll_fd() const override { return timer_.get(); }
  std::string_view name() const override { return "paced-sim"; }

 private:
  struct Queued {
    std::chrono::steady_clock::time_point due;
    transport::Completion completion;
  };

  CommandRecord record_of(transport::PathId path, const transport::Command& command) const {
    CommandRecord record;
    const auto device = devices_.find(path);
    record.device = device == devices_.end() ? std::string() : device->second;
    record.opcode = command.cdb[0];
    record.service_action = command.cdb[1] & 0x1f;
    const auto big_endian = [&](std::size_t offset) {
      std::uint64_t value = 0;
      for (std::size_t i = 0; i < 8 && offset + i < command.data_out.size(); ++i) {
        value = (value << 8) | command.data_out[offset + i];
      }
      return value;
    };
    if (record.opcode == CommandRecord::kPrOut && command.data_out.size() >= 16) {
      record.key = big_endian(0);
      record.sa_key = big_endian(8);
    }
    return record;
  }

  void count_in_flight() {
    stats_.in_flight = queue_.size();
    if (queue_.size() > stats_.in_flight_max) {
      stats_.in_flight_max = queue_.size();
    }
  }

  void arm() {
    itimerspec spec{};
    if (!queue_.empty()) {
      const auto due = std::max(queue_.front().due.time_since_epoch(), std::chrono::nanoseconds(1));
      spec.it_value.tv_sec = std::chrono::duration_cast<std::chrono::seconds>(due).count();
      spec.it_value.tv_nsec = (due % std::chrono::seconds(1)).count();
    }
    // steady_clock is CLOCK_MONOTONIC on Linux.
    (void)::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &spec, nullptr);
  }

  std::chrono::nanoseconds latency_;
  TransportStats& stats_;
  UniqueFd timer_;
  std::unique_ptr<transport::SimTransport> inner_;
  std::deque<Queued> queue_;
  std::chrono::steady_clock::time_point last_due_{};
  std::map<transport::PathId, std::string> devices_;
};

// A simulated target with one LU per device name the configuration uses, reached as
// /dev/sim-<name> on nexus 1, and the DaemonEnv that puts a Daemon on it.
class SimDevices {
 public:
  explicit SimDevices(std::chrono::microseconds latency = std::chrono::microseconds(500))
      : latency_(latency) {}

  // The LU behind a device name, created at its first use.
  transport::LuId lu(const std::string& device) {
    const auto found = std::find(names_.begin(), names_.end(), device);
    if (found != names_.end()) {
      return static_cast<transport::LuId>(found - names_.begin());
    }
    const transport::LuId id = target_.add_lu();
    target_.add_path("/dev/sim-" + device, id, 1);
    names_.push_back(device);
    return id;
  }

  DaemonEnv env() {
    return {
        .transport = [this](const std::string&) -> Result<std::unique_ptr<transport::Transport>> {
          return std::make_unique<PacedSimTransport>(target_, latency_, stats_);
        },
        .resolve = [this](const ResourceConfig& resource) -> Result<std::vector<pr::LogicalUnit>> {
          std::vector<pr::LogicalUnit> lus;
          for (const auto& device : resource.devices) {
            const transport::LuId id = lu(device);
            lus.push_back(
                {.wwn = "naa.sim" + std::to_string(id),
                 .name = device,
                 .paths = {{.sg = "/dev/sim-" + device, .sd = {}, .hctl = {}, .initiator = {}}}});
          }
          return lus;
        },
        .group_lookup = group_id,
        .epochs =
            [](const std::string& state_dir) { return fence::make_file_epoch_store(state_dir); },
        // The simulated LUs have no block device, and nothing writes to them but the tests.
        .writes_in_flight = [](const pr::LogicalUnit&) -> Result<std::uint64_t> { return 0; },
        // The simulated transport has no device nodes to check.
        .check_identity = nullptr,
        // Nor any multipath map on its LUs.
        .host_queues = nullptr};
  }

  transport::SimTarget& target() { return target_; }
  TransportStats& stats() { return stats_; }

 private:
  std::chrono::microseconds latency_;
  TransportStats stats_;
  transport::SimClock clock_;
  transport::SimTarget target_{clock_};
  std::vector<std::string> names_;
};

// Runs Daemon::make(config, env) and Daemon::run() on a thread of its own; the destructor stops it
// with SIGTERM sent to that thread, as systemd's would be to the process. SIGTERM, SIGINT and
// SIGHUP are blocked in the constructing thread first (sd-event reads them from a signalfd, and the
// daemon's thread inherits the mask), so construct it before any other thread is started.
class DaemonThread {
 public:
  DaemonThread(Config config, DaemonEnv env) {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGHUP);
    (void)pthread_sigmask(SIG_BLOCK, &signals, &saved_mask_);
    // Shared: the thread may still be inside set_value() when this constructor returns.
    auto made = std::make_shared<std::promise<std::string>>();
    auto made_future = made->get_future();
    thread_ = std::thread([made, config = std::move(config), env = std::move(env), this]() mutable {
      auto daemon = Daemon::make(std::move(config), std::move(env));
      if (!daemon) {
        made->set_value(daemon.error().message());
        return;
      }
      made->set_value("");
      exit_status_ = (*daemon)->run();
    });
    error_ = made_future.get();
  }
  ~DaemonThread() {
    stop();
    (void)pthread_sigmask(SIG_SETMASK, &saved_mask_, nullptr);
  }
  DaemonThread(const DaemonThread&) = delete;
  DaemonThread& operator=(const DaemonThread&) = delete;

  // Empty when the daemon was made; its error otherwise (the thread has ended then).
  const std::string& error() const { return error_; }
  // Stops the daemon and returns run()'s exit status.
  int stop() {
    if (thread_.joinable()) {
      (void)pthread_kill(thread_.native_handle(), SIGTERM);
      thread_.join();
    }
    return exit_status_;
  }

 private:
  sigset_t saved_mask_{};
  std::thread thread_;
  std::string error_;
  int exit_status_ = -1;
};

// A blocking client of the control socket for threads other than the daemon's: every read waits
// at most `wait`, and says so instead of hanging.
class LineClient {
 public:
  explicit LineClient(const std::string& path) {
    fd_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.c_str(), std::min(path.size() + 1, sizeof address.sun_path));
    connected_ = fd_.valid() && ::connect(fd_.get(), reinterpret_cast<const sockaddr*>(&address),
                                          sizeof address) == 0;
  }
  bool connected() const { return connected_; }
  int fd() const { return fd_.get(); }
  // Hangs up, as a caller that was killed.
  void close() { fd_ = UniqueFd(); }

  bool write(const std::string& bytes) {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_.get(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        return false;
      }
      sent += static_cast<std::size_t>(n);
    }
    return true;
  }

  // The next line without its '\n'; nullopt at EOF, on an error, or when wait passed.
  std::optional<std::string> read_line(std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
      const auto newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return std::nullopt;
      }
      pollfd entry{.fd = fd_.get(), .events = POLLIN, .revents = 0};
      if (::poll(&entry, 1, static_cast<int>(left.count())) <= 0) {
        continue;
      }
      char chunk[65536];
      const ssize_t got = ::recv(fd_.get(), chunk, sizeof chunk, 0);
      if (got <= 0) {
        return std::nullopt;
      }
      buffer_.append(chunk, static_cast<std::size_t>(got));
    }
  }
  // Whether the daemon closed the connection within wait, without reading anything: a unix
  // socket whose peer has gone polls POLLHUP whatever is still queued to it (af_unix.c:
  // unix_poll()), so a client that never reads can tell it was dropped.
  bool closed_within(std::chrono::milliseconds wait) {
    pollfd entry{.fd = fd_.get(), .events = POLLRDHUP, .revents = 0};
    const int ready = ::poll(&entry, 1, static_cast<int>(wait.count()));
    return ready == 1 && (entry.revents & (POLLHUP | POLLRDHUP)) != 0;
  }

 private:
  UniqueFd fd_;
  bool connected_ = false;
  std::string buffer_;
};

}  // namespace blkfence::daemon::testing

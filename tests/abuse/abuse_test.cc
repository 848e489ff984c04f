// The abuse harness (issue 12, docs/control-protocol.md "Limits"): fencing stays online while local
// users abuse the control socket. A real Daemon runs in this process on a simulated LU
// (daemon/sim_daemon_testing.h: 1 ms a command, a check every 200 ms, a 2 s lease); four
// blkfence_abuser processes, each as its own unprivileged uid (setpriv), hold idle connections
// (more than the unprivileged places), flood `keys`, keep a `watch` that never reads and send
// slow partial lines; then this process runs out of file descriptors (EMFILE on accept). Through
// it all, a root client measures how long an acquire takes (connect included: it needs one of the
// places kept for privileged peers) and how old the last good check gets, and the harness asserts
// generous bounds: an acquire answered within 3 s, no check older than half the lease and no lost
// contact, and accept tried once a pause (1 s) while it fails, not on every loop iteration. It
// prints the figures with and without abuse.
//
// Needs root (the abusers run as other uids), and exits 77 otherwise; CI runs as root.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blkfence/control/protocol.h"

#include "glue_testing.h"
#include "log.h"
#include "sim_daemon_testing.h"

extern char** environ;

namespace blkfence::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kCheckInterval = 200ms;
constexpr auto kLease = 2000ms;
constexpr auto kPhase = 3s;       // each measured phase
constexpr auto kAcquireMax = 3s;  // the bound on one acquire, connect included
// What abuse must never cost is contact: a check as old as the lease closes the gate. Half the
// lease leaves room for a loaded machine (the sanitizer build beside the simulation on two cores
// once saw 656 ms under EMFILE, where an idle machine sees 210 ms); the figures are printed.
constexpr auto kCheckAgeMax = kLease / 2;
constexpr auto kWait = 10s;  // any single answer; beyond it the harness fails
constexpr uid_t kAbuserUids[] = {65534, 65533, 65532, 65531};

struct Figures {
  std::chrono::milliseconds acquire_max{0};
  std::chrono::milliseconds acquire_median{0};
  std::chrono::milliseconds check_age_max{0};  // the oldest last good check seen
  double check_period_ms = 0;                  // the mean time between checks
};

std::string encode(control::Op op, std::uint64_t id, std::string resource = "pgdata") {
  return control::encode_request(
      {.id = id, .op = op, .resource = std::move(resource), .node = {}, .timeout = {}});
}

class AbuseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_target(LogTarget::kStderr);
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);  // the abusers reach the socket through it
  }
  void TearDown() override { stop_abusers(); }

  std::string socket_path() const { return dir_ / "run/control.sock"; }

  std::optional<control::Reply> ask(testing::LineClient& client, const std::string& line) {
    if (!client.write(line)) {
      return std::nullopt;
    }
    const auto got = client.read_line(kWait);
    if (!got) {
      return std::nullopt;
    }
    auto reply = control::parse_reply(*got);
    return reply ? std::optional(*reply) : std::nullopt;
  }

  // How many checks the monitor has made, from the metrics.
  std::optional<double> checks(testing::LineClient& probe) {
    return metric(probe, "blkfence_check_latency_seconds_count{resource=\"pgdata\"}");
  }
  // A sample of the daemon's metrics.
  std::optional<double> metric(testing::LineClient& probe, const std::string& sample) {
    const auto reply = ask(probe, encode(control::Op::kMetrics, 1, ""));
    if (!reply || !reply->ok) {
      return std::nullopt;
    }
    const std::string text = reply->body.value("text", "");
    const std::string name = "\n" + sample + " ";
    const auto at = text.find(name);
    return at == std::string::npos ? std::nullopt
                                   : std::optional(std::stod(text.substr(at + name.size())));
  }

  // Measures for kPhase: the age of the last good check every 50 ms (a sampling interval, not a
  // wait for anything), then acquire-and-release cycles from fresh root connections.
  Figures measure(const char* phase, testing::LineClient& probe, bool acquire = true) {
    Figures figures;
    EXPECT_TRUE(probe.connected()) << phase;
    const auto checks_before = checks(probe);
    const auto started = Clock::now();
    while (Clock::now() - started < kPhase) {
      const auto reply = ask(probe, encode(control::Op::kStatus, 2));
      if (!reply || !reply->ok) {
        ADD_FAILURE() << phase << ": no status";
        return figures;
      }
      const auto& status = reply->body["resources"][0];
      if (status.contains("last_check_age_ms") && status["last_check_age_ms"].is_number()) {
        figures.check_age_max =
            std::max(figures.check_age_max,
                     std::chrono::milliseconds(status["last_check_age_ms"].get<std::int64_t>()));
      }
      std::this_thread::sleep_for(50ms);
    }
    const auto checks_after = checks(probe);
    const double elapsed_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - started).count();
    if (checks_before && checks_after && *checks_after > *checks_before) {
      figures.check_period_ms = elapsed_ms / (*checks_after - *checks_before);
    } else {
      ADD_FAILURE() << phase << ": no check counted";
    }
    if (acquire) {
      std::vector<std::chrono::milliseconds> times;
      for (std::uint64_t cycle = 0; cycle < 3; ++cycle) {
        times.push_back(acquire_once(phase));
      }
      std::sort(times.begin(), times.end());
      figures.acquire_median = times[1];
      figures.acquire_max = times[2];
    }
    return figures;
  }

  // One acquire on a fresh connection, as Patroni's hook makes it, and its release.
  std::chrono::milliseconds acquire_once(const char* phase) {
    const auto started = Clock::now();
    testing::LineClient client(socket_path());
    const auto acquired = ask(client, encode(control::Op::kAcquire, 3));
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    EXPECT_TRUE(acquired && acquired->ok)
        << phase
        << ": acquire: " << (acquired && acquired->error ? acquired->error->message : "no reply");
    const auto released = ask(client, encode(control::Op::kRelease, 4));
    EXPECT_TRUE(released && released->ok) << phase << ": release";
    return took;
  }

  // Starts one abuser per uid: 12 idle connections, a keys flood, a watch that never reads and
  // 2 slow partial lines each (16, the per-uid limit; 64 in all, beyond the 56 unprivileged
  // places).
  void start_abusers() {
    const std::string program = dir_ / "blkfence_abuser";  // where every uid may run it
    std::filesystem::copy_file(BLKFENCE_ABUSER, program);
    ASSERT_EQ(::chmod(program.c_str(), 0755), 0);
    for (const uid_t uid : kAbuserUids) {
      int out[2];
      ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
      // This thread blocks SIGTERM for the daemon's signalfd (DaemonThread); the abuser must not.
      posix_spawnattr_t attributes;
      posix_spawnattr_init(&attributes);
      sigset_t none;
      sigemptyset(&none);
      posix_spawnattr_setsigmask(&attributes, &none);
      posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK);
      const std::string reuid = "--reuid=" + std::to_string(uid);
      std::vector<std::string> args = {"setpriv",
                                       reuid,
                                       "--regid=65534",
                                       "--clear-groups",
                                       program,
                                       socket_path(),
                                       "pgdata",
                                       "12",
                                       "1",
                                       "1",
                                       "2"};
      std::vector<char*> argv;
      for (auto& arg : args) {
        argv.push_back(arg.data());
      }
      argv.push_back(nullptr);
      pid_t pid = 0;
      const int spawned =
          ::posix_spawnp(&pid, "setpriv", &actions, &attributes, argv.data(), environ);
      posix_spawn_file_actions_destroy(&actions);
      posix_spawnattr_destroy(&attributes);
      ::close(out[1]);
      ASSERT_EQ(spawned, 0) << "setpriv: " << std::strerror(spawned);
      abusers_.push_back({pid, UniqueFd(out[0])});
    }
    for (auto& abuser : abusers_) {
      ASSERT_EQ(read_from(abuser, kWait), "ready\n") << "an abuser did not start";
    }
  }

  void stop_abusers() {
    for (auto& abuser : abusers_) {
      (void)::kill(abuser.pid, SIGTERM);
    }
    for (auto& abuser : abusers_) {
      int status = 0;
      (void)::waitpid(abuser.pid, &status, 0);
      std::printf("abuser %d: %s", static_cast<int>(abuser.pid), read_from(abuser, 2s).c_str());
    }
    abusers_.clear();
  }

  struct Abuser {
    pid_t pid;
    UniqueFd out;
  };
  // What the abuser wrote, up to its next newline or wait.
  static std::string read_from(Abuser& abuser, std::chrono::milliseconds wait) {
    std::string text;
    const auto deadline = Clock::now() + wait;
    while (!text.ends_with('\n') && Clock::now() < deadline) {
      pollfd entry{.fd = abuser.out.get(), .events = POLLIN, .revents = 0};
      if (::poll(&entry, 1, 100) <= 0) {
        continue;
      }
      char byte = 0;
      if (::read(abuser.out.get(), &byte, 1) != 1) {
        break;
      }
      text += byte;
    }
    return text;
  }

  testing::TempDir dir_;
  std::vector<Abuser> abusers_;
};

double cpu_seconds() {
  rusage usage{};
  (void)::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

void print(const char* phase, const Figures& f) {
  std::printf(
      "%-22s acquire median %5lld ms, max %5lld ms; check period %6.1f ms, oldest check "
      "%4lld ms\n",
      phase, static_cast<long long>(f.acquire_median.count()),
      static_cast<long long>(f.acquire_max.count()), f.check_period_ms,
      static_cast<long long>(f.check_age_max.count()));
}

TEST_F(AbuseTest, FencingStaysOnlineWhileLocalUsersAbuseTheControlSocket) {
  testing::SimDevices devices(1ms);
  Config config;
  config.cluster = "abuse";
  config.node_id = 1;
  config.state_dir = dir_ / "state";
  config.run_dir = dir_ / "run";
  ResourceConfig resource;
  resource.name = "pgdata";
  resource.devices = {"lu0"};
  resource.check_interval = kCheckInterval;
  resource.lease = kLease;
  resource.command_timeout = 1000ms;
  resource.on_fenced.action = OnFencedAction::kNone;
  config.resources = {resource};
  testing::DaemonThread daemon(std::move(config), devices.env());
  ASSERT_EQ(daemon.error(), "");
  {  // the first read: until then the state is unknown and an acquire is refused
    testing::LineClient watch(socket_path());
    auto reply = ask(watch, encode(control::Op::kWatch, 1));
    ASSERT_TRUE(reply && reply->ok);
    std::string state = reply->body["resources"][0].value("state", "");
    while (state == "unknown") {
      const auto line = watch.read_line(kWait);
      ASSERT_TRUE(line) << "no event while the state is unknown";
      state = nlohmann::json::parse(*line)["status"].value("state", "");
    }
  }

  testing::LineClient probe(socket_path());  // root: it may use a reserved place
  const Figures quiet = measure("without abuse", probe);

  start_abusers();
  const Figures abused = measure("under abuse", probe);

  // Out of file descriptors: accept(2) fails with EMFILE while the abusers keep connecting. The
  // probe's connection is open already; an acquire needs a new one, so it comes after.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  Figures emfile;
  double cpu_share = 0;
  double accept_failures = 0;
  double emfile_seconds = 0;
  {
    rlimit low = saved;
    low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 1024);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    // The abusers' churn makes the daemon close connections, which frees descriptors: a hog takes
    // every free one, again every 5 ms (an abuser's pace), for the whole phase.
    std::atomic<bool> hogging{true};
    std::thread hog([&] {
      std::vector<UniqueFd> held;
      while (hogging) {
        for (;;) {
          UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
          if (!fd.valid()) {
            break;
          }
          held.push_back(std::move(fd));
        }
        std::this_thread::sleep_for(5ms);
      }
    });
    const auto failures_before = metric(probe, "blkfence_control_accept_failures_total");
    const double cpu_before = cpu_seconds();
    const auto started = Clock::now();
    emfile = measure("out of descriptors", probe, false);
    emfile_seconds = std::chrono::duration<double>(Clock::now() - started).count();
    cpu_share = (cpu_seconds() - cpu_before) / emfile_seconds;
    const auto failures_after = metric(probe, "blkfence_control_accept_failures_total");
    ASSERT_TRUE(failures_before && failures_after);
    accept_failures = *failures_after - *failures_before;
    hogging = false;
    hog.join();
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  }
  const auto after_emfile = acquire_once("after EMFILE");
  const auto lost_contact = metric(probe, "blkfence_lost_contact_total{resource=\"pgdata\"}");
  stop_abusers();

  print("without abuse", quiet);
  print("under abuse", abused);
  print("out of descriptors", emfile);
  std::printf(
      "%-22s acquire %lld ms; while accept failed: %.0f failures in %.1f s, CPU %.0f%% of "
      "one core\n",
      "after EMFILE", static_cast<long long>(after_emfile.count()), accept_failures, emfile_seconds,
      cpu_share * 100);

  EXPECT_LE(abused.acquire_max, kAcquireMax);
  EXPECT_LE(abused.check_age_max, kCheckAgeMax);
  EXPECT_LE(abused.check_period_ms, 3.0 * kCheckInterval.count());
  EXPECT_LE(emfile.check_age_max, kCheckAgeMax);
  EXPECT_LE(emfile.check_period_ms, 3.0 * kCheckInterval.count());
  EXPECT_LE(after_emfile, kAcquireMax);
  ASSERT_TRUE(lost_contact);
  EXPECT_EQ(*lost_contact, 0) << "the lease ran out without a check while the socket was abused";
  // One try per 1 s pause, not one per loop iteration (the CPU share is printed, not asserted:
  // on a shared machine it says more about the neighbours than about the loop).
  EXPECT_GE(accept_failures, 1) << "accept never failed: the phase did not run out of descriptors";
  EXPECT_LE(accept_failures, emfile_seconds + 2) << "the loop retries accept while it fails";
}

}  // namespace
}  // namespace blkfence::daemon

int main(int argc, char** argv) {
  if (::geteuid() != 0) {
    std::printf(
        "skipped: the abuse harness runs its abusers as other users (setpriv), which "
        "needs root\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

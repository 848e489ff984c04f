// Proves blkfenced's answers on its control socket (daemon.cc, docs/control-protocol.md), with a
// real Daemon (no resources: no device is needed) serving a socket in a temporary directory and
// requests and replies in the control library's encoding: a well-formed request gets its reply with
// its id; malformed, unknown-op, wrong-version and unknown-resource requests get their error codes
// and the connection goes on serving; a line over 64 KiB gets too-large and the connection is
// closed; and the permission check sees the real peer: root and control_group members (primary or
// supplementary, read by SO_PEERCRED and SO_PEERGROUPS) may ask for changes, another user may read
// but is told permission-denied for a change. Those last ones run the client in a child process
// with another uid and gid, so they need root (CI runs as root) and skip otherwise.
// With a resource on a simulated target (sim_daemon_testing.h, the daemon on a thread of its own):
// a `watch` client that never reads is dropped once its unread output passes the bound, and the
// daemon goes on answering others; and `keys` requests of many clients at once share one read of
// the LUs at a time (the device never sees more than that read's commands beside the monitor's),
// and each gets the read's answer. An acquire whose caller hangs up after its REGISTER, or whose
// --timeout passes during its first read, sends no PR OUT that could take the LU (no PREEMPT,
// RESERVE or REGISTER of a new key reaches the target) and ends released with the other node
// still holding. control_group is looked up once, at start, however many connections and requests
// come. With two resources, an epoch store whose fsync stalls for ten check intervals fails the
// acquire before its REGISTER, and the other resource's monitor keeps reading its LU at its period
// throughout.
#include <chrono>
#include <thread>

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "blkfence/codec/prout.h"
#include "blkfence/control/protocol.h"
#include "blkfence/fence/epoch_store.h"
#include "blkfence/key.h"

#include "daemon.h"
#include "glue_testing.h"
#include "log.h"
#include "sim_daemon_testing.h"

namespace blkfence::daemon {
namespace {

using testing::RawClient;
using testing::run_until;
using testing::TempDir;

class DaemonControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_log_target(LogTarget::kStderr);
    // The run directory is 0755, as blkfenced makes it; its parent must let other users in too.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  }
  void TearDown() override {
    daemon_.reset();
    sd_event_unref(event_);
  }

  void start(std::string control_group = "", GroupLookup group_lookup = group_id) {
    Config config;
    config.cluster = "glue";
    config.node_id = 7;
    config.control_group = std::move(control_group);
    config.state_dir = dir_ / "state";
    config.run_dir = dir_ / "run";
    config.transport = "sgio";  // no device is ever opened: there is no resource
    DaemonEnv env = system_daemon_env();
    env.group_lookup = group_lookup;
    auto made = Daemon::make(std::move(config), env);
    ASSERT_TRUE(made) << made.error().message();
    daemon_ = std::move(*made);
    // Daemon::make() serves the socket on this thread's default loop; the test runs that loop.
    ASSERT_GE(sd_event_default(&event_), 0);
  }
  std::string socket_path() const { return dir_ / "run/control.sock"; }

  // One request line, and the reply to it, on client.
  control::Reply ask(RawClient& client, const std::string& line) {
    client.write(line);
    const auto reply_line = client.read_line();
    if (!reply_line) {
      ADD_FAILURE() << "no reply to " << line;
      return {};
    }
    auto reply = control::parse_reply(*reply_line);
    if (!reply) {
      ADD_FAILURE() << "unreadable reply " << *reply_line << ": " << reply.error();
      return {};
    }
    return *reply;
  }
  control::Reply ask(RawClient& client, const control::Request& request) {
    return ask(client, control::encode_request(request));
  }

  // The reply to request, asked by a child process as uid and gid with supplementary groups.
  control::Reply ask_as(uid_t uid, gid_t gid, const std::vector<gid_t>& groups,
                        const control::Request& request);

  TempDir dir_;
  std::unique_ptr<Daemon> daemon_;
  sd_event* event_ = nullptr;
};

control::Reply DaemonControlTest::ask_as(uid_t uid, gid_t gid, const std::vector<gid_t>& groups,
                                         const control::Request& request) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe2";
    return {};
  }
  UniqueFd from_child(pipe_fds[0]);
  UniqueFd to_parent(pipe_fds[1]);
  // Everything the child needs is prepared before fork(): the daemon's transport has threads, so
  // the child makes system calls only (raw ones for the ids: glibc's would try to set every
  // thread's).
  const std::string line = control::encode_request(request);
  const std::string path = socket_path();
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const pid_t child = ::fork();
  if (child == 0) {
    const bool dropped = ::syscall(SYS_setgroups, groups.size(), groups.data()) == 0 &&
                         ::syscall(SYS_setresgid, gid, gid, gid) == 0 &&
                         ::syscall(SYS_setresuid, uid, uid, uid) == 0;
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!dropped || fd < 0 ||
        ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
        ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      ::_exit(2);
    }
    // Copy the reply to the parent up to its newline (the parent bounds the wait).
    char byte = 0;
    while (::read(fd, &byte, 1) == 1) {
      if (::write(to_parent.get(), &byte, 1) != 1 || byte == '\n') {
        break;
      }
    }
    ::_exit(0);
  }
  to_parent = UniqueFd();
  (void)::fcntl(from_child.get(), F_SETFL, O_NONBLOCK);
  if (child < 0) {
    ADD_FAILURE() << "fork";
    return {};
  }
  std::string reply_line;
  bool done = false;
  run_until(
      event_,
      [&] {
        char chunk[4096];
        const ssize_t got = ::read(from_child.get(), chunk, sizeof chunk);
        if (got > 0) {
          reply_line.append(chunk, static_cast<std::size_t>(got));
        }
        done = got == 0 || (got < 0 && errno != EAGAIN) || reply_line.ends_with('\n');
        return done;
      },
      "the child's reply");
  int status = 0;
  (void)::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child could not ask";
  if (!reply_line.ends_with('\n')) {
    ADD_FAILURE() << "no reply for the child";
    return {};
  }
  reply_line.pop_back();
  auto reply = control::parse_reply(reply_line);
  if (!reply) {
    ADD_FAILURE() << "unreadable reply " << reply_line;
    return {};
  }
  return *reply;
}

control::Request request(control::Op op, std::string resource = "", std::uint64_t id = 1) {
  return {.id = id, .op = op, .resource = std::move(resource), .node = {}, .timeout = {}};
}

TEST_F(DaemonControlTest, StatusIsAnsweredWithItsIdTheClusterAndTheNode) {
  start();
  RawClient client(event_, socket_path());
  const auto reply = ask(client, request(control::Op::kStatus, "", 41));
  ASSERT_TRUE(reply.ok) << reply.body.dump();
  EXPECT_EQ(reply.id, 41U);
  EXPECT_EQ(reply.body.value("cluster", ""), "glue");
  EXPECT_EQ(reply.body.value("node", 0), 7);
  EXPECT_EQ(reply.body["resources"], nlohmann::json::array());
}

TEST_F(DaemonControlTest, MetricsAreAnsweredInThePrometheusTextForm) {
  start();
  RawClient client(event_, socket_path());
  const auto reply = ask(client, request(control::Op::kMetrics, "", 2));
  ASSERT_TRUE(reply.ok);
  EXPECT_NE(reply.body.value("text", "").find("# TYPE blkfence_gate_open gauge"),
            std::string::npos);
}

TEST_F(DaemonControlTest, MalformedRequestsGetErrorsAndTheConnectionGoesOn) {
  start();
  RawClient client(event_, socket_path());
  struct Case {
    std::string line;
    control::ReplyError code;
    std::optional<std::uint64_t> id;
  };
  const Case cases[] = {
      {"this is not json\n", control::ReplyError::kBadRequest, std::nullopt},
      {"[1,2,3]\n", control::ReplyError::kBadRequest, std::nullopt},
      {R"({"v":1,"id":3,"op":"format-disk"})"
       "\n",
       control::ReplyError::kBadRequest, 3},
      {R"({"v":1,"id":4,"op":"status","colour":"red"})"
       "\n",
       control::ReplyError::kBadRequest, 4},
      {R"({"v":1,"id":5,"op":"acquire"})"
       "\n",
       control::ReplyError::kBadRequest, 5},
      {R"({"v":2,"id":6,"op":"status"})"
       "\n",
       control::ReplyError::kUnsupportedVersion, 6},
      {std::string(100, '[') + "\n", control::ReplyError::kBadRequest, std::nullopt},
  };
  for (const Case& c : cases) {
    const auto reply = ask(client, c.line);
    EXPECT_FALSE(reply.ok) << c.line;
    ASSERT_TRUE(reply.error) << c.line;
    EXPECT_EQ(reply.error->code, c.code) << c.line << ": " << reply.error->message;
    EXPECT_EQ(reply.id, c.id) << c.line;
    EXPECT_FALSE(reply.error->message.empty()) << c.line;
  }
  const auto reply = ask(client, request(control::Op::kStatus, "", 9));
  EXPECT_TRUE(reply.ok);
  EXPECT_EQ(reply.id, 9U);
}

TEST_F(DaemonControlTest, AnUnknownResourceIsNamedInTheError) {
  start();
  RawClient client(event_, socket_path());
  for (const auto op :
       {control::Op::kStatus, control::Op::kGate, control::Op::kKeys, control::Op::kWatch}) {
    const auto reply = ask(client, request(op, "pgdata", 12));
    ASSERT_TRUE(reply.error) << control::to_string(op);
    EXPECT_EQ(reply.error->code, control::ReplyError::kUnknownResource);
    EXPECT_EQ(reply.id, 12U);
    EXPECT_NE(reply.error->message.find("\"pgdata\""), std::string::npos) << reply.error->message;
  }
}

TEST_F(DaemonControlTest, ALineOverTheLimitGetsTooLargeAndTheConnectionIsClosed) {
  start();
  RawClient client(event_, socket_path());
  client.write(std::string(control::kMaxRequestSize + 1, ' '));
  const auto line = client.read_line();
  ASSERT_TRUE(line);
  const auto reply = control::parse_reply(*line);
  ASSERT_TRUE(reply && reply->error) << *line;
  EXPECT_EQ(reply->error->code, control::ReplyError::kTooLarge);
  EXPECT_EQ(reply->id, std::nullopt);
  // The line's end and a request after it (if the daemon still reads): it is not answered.
  (void)client.try_write("\n" + control::encode_request(request(control::Op::kStatus)));
  EXPECT_TRUE(client.await_eof());
  EXPECT_EQ(client.unread(), "");
  // The daemon serves the next connection.
  RawClient next(event_, socket_path());
  EXPECT_TRUE(ask(next, request(control::Op::kStatus)).ok);
}

TEST_F(DaemonControlTest, RootMayAskForAChange) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "runs as root only (the client must be root)";
  }
  start();
  RawClient client(event_, socket_path());
  // Past the permission check to the resource lookup: unknown-resource, not permission-denied.
  const auto reply = ask(client, request(control::Op::kAcquire, "pgdata"));
  ASSERT_TRUE(reply.error);
  EXPECT_EQ(reply.error->code, control::ReplyError::kUnknownResource) << reply.error->message;
}

// uid and gid of an unprivileged user and the name of a group to configure as control_group.
struct Nobody {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string group;  // the name of gid's group
};
std::optional<Nobody> nobody() {
  const passwd* user = ::getpwnam("nobody");
  if (user == nullptr || user->pw_uid == 0) {
    return std::nullopt;
  }
  const group* entry = ::getgrgid(user->pw_gid);
  if (entry == nullptr) {
    return std::nullopt;
  }
  return Nobody{.uid = user->pw_uid, .gid = user->pw_gid, .group = entry->gr_name};
}

// A gid that is neither nobody's nor any group this test configures.
constexpr gid_t kOtherGid = 54321;

#define REQUIRE_ROOT_AND_NOBODY(who)                                                    \
  const auto who = nobody();                                                            \
  if (::geteuid() != 0 || !(who)) {                                                     \
    GTEST_SKIP() << "runs as root only, with a user 'nobody' (the client changes ids)"; \
  }

TEST_F(DaemonControlTest, AnotherUserMayReadButNotChange) {
  REQUIRE_ROOT_AND_NOBODY(user);
  start();
  const auto read = ask_as(user->uid, user->gid, {}, request(control::Op::kStatus));
  EXPECT_TRUE(read.ok);
  const auto change = ask_as(user->uid, user->gid, {}, request(control::Op::kAcquire, "pgdata", 8));
  ASSERT_TRUE(change.error);
  EXPECT_EQ(change.error->code, control::ReplyError::kPermissionDenied);
  EXPECT_EQ(change.id, 8U);
  EXPECT_NE(
      change.error->message.find("acquire needs root (uid " + std::to_string(user->uid) + ")"),
      std::string::npos)
      << change.error->message;
}

TEST_F(DaemonControlTest, AnotherUserOutsideControlGroupMayNotChange) {
  REQUIRE_ROOT_AND_NOBODY(user);
  start(user->group);
  const auto change = ask_as(user->uid, kOtherGid, {}, request(control::Op::kAcquire, "pgdata"));
  ASSERT_TRUE(change.error);
  EXPECT_EQ(change.error->code, control::ReplyError::kPermissionDenied);
  EXPECT_NE(change.error->message.find("or membership of group " + user->group), std::string::npos)
      << change.error->message;
}

TEST_F(DaemonControlTest, APrimaryGroupMemberOfControlGroupMayChange) {
  REQUIRE_ROOT_AND_NOBODY(user);
  start(user->group);
  const auto change = ask_as(user->uid, user->gid, {}, request(control::Op::kRelease, "pgdata"));
  ASSERT_TRUE(change.error);
  EXPECT_EQ(change.error->code, control::ReplyError::kUnknownResource) << change.error->message;
}

TEST_F(DaemonControlTest, ASupplementaryGroupMemberOfControlGroupMayChange) {
  REQUIRE_ROOT_AND_NOBODY(user);
  start(user->group);
  const auto change =
      ask_as(user->uid, kOtherGid, {user->gid}, request(control::Op::kUnfence, "pgdata"));
  ASSERT_TRUE(change.error);
  EXPECT_EQ(change.error->code, control::ReplyError::kUnknownResource) << change.error->message;
}

// A group lookup that counts its calls and finds a group no peer here is in.
int g_group_lookups = 0;
std::optional<gid_t> counting_lookup(const std::string&) {
  ++g_group_lookups;
  return kOtherGid + 1;
}

TEST_F(DaemonControlTest, TheControlGroupIsLookedUpOnceHoweverManyRequestsCome) {
  // From a user other than root (root is admitted without a look at the group): nobody when the
  // test runs as root, else the test's own user.
  const auto user = nobody();
  const bool root = ::geteuid() == 0;
  if (root && !user) {
    GTEST_SKIP() << "as root, the client needs a user 'nobody'";
  }
  g_group_lookups = 0;
  start("blkfence", counting_lookup);
  EXPECT_EQ(g_group_lookups, 1);
  for (std::uint64_t id = 1; id <= 5; ++id) {  // a connection and a change each
    const control::Request change = request(control::Op::kAcquire, "pgdata", id);
    control::Reply reply;
    if (root) {
      reply = ask_as(user->uid, user->gid, {}, change);
    } else {
      RawClient client(event_, socket_path());
      reply = ask(client, change);
    }
    ASSERT_TRUE(reply.error);
    EXPECT_EQ(reply.error->code, control::ReplyError::kPermissionDenied) << reply.error->message;
  }
  EXPECT_EQ(g_group_lookups, 1);
}

// A daemon with one resource (or two) on simulated LUs, run on its own thread.
class SimDaemonTest : public ::testing::Test {
 public:
  struct Options {
    std::chrono::microseconds latency{500};  // of each command (PacedSimTransport)
    // pgdata on lu0; with two, pgwal on lu1 too.
    std::size_t resources = 1;
    std::chrono::milliseconds check_interval{100};
    std::chrono::milliseconds lease{1000};
    std::chrono::milliseconds command_timeout{500};
    Mode mode = Mode::kExclusive;
    // Runs on the target before the daemon does (nothing else touches it yet).
    std::function<void(testing::SimDevices&)> before;
    // The epoch store the daemon puts behind its bounded wait (DaemonEnv::epochs); none: the file
    // store in state_dir.
    std::function<std::unique_ptr<fence::EpochStore>(const std::string& state_dir)> epochs;
  };

 protected:
  static constexpr std::chrono::seconds kWait{20};  // far beyond any answer here; a failure

  void SetUp() override { set_log_target(LogTarget::kStderr); }

  void start(std::chrono::microseconds latency = std::chrono::microseconds(500)) {
    Options options;
    options.latency = latency;
    start(options);
  }
  void start(const Options& options) {
    devices_ = std::make_unique<testing::SimDevices>(options.latency);
    Config config;
    config.cluster = "glue";
    config.node_id = 7;
    config.state_dir = dir_ / "state";
    config.run_dir = dir_ / "run";
    for (std::size_t i = 0; i < options.resources; ++i) {
      ResourceConfig resource;
      resource.name = i == 0 ? "pgdata" : "pgwal";
      resource.devices = {"lu" + std::to_string(i)};
      resource.check_interval = options.check_interval;
      resource.lease = options.lease;
      resource.command_timeout = options.command_timeout;
      resource.mode = options.mode;
      resource.on_fenced.action = OnFencedAction::kNone;
      config.resources.push_back(resource);
      (void)devices_->lu(resource.devices[0]);
    }
    if (options.before) {
      options.before(*devices_);
    }
    DaemonEnv env = devices_->env();
    if (options.epochs) {
      env.epochs = options.epochs;
    }
    daemon_ = std::make_unique<testing::DaemonThread>(std::move(config), std::move(env));
    ASSERT_EQ(daemon_->error(), "");
  }
  void TearDown() override {
    if (daemon_) {
      EXPECT_EQ(daemon_->stop(), 0);
    }
    daemon_.reset();
  }
  std::string socket_path() const { return dir_ / "run/control.sock"; }

  // Waits, on a watch of its own, until the resource's first read has told its state.
  void await_state_known(const std::string& resource = "pgdata") {
    testing::LineClient watch(socket_path());
    const auto reply = ask(watch, request(control::Op::kWatch, resource, 1));
    ASSERT_TRUE(reply.ok);
    std::string state = reply.body["resources"][0].value("state", "");
    while (state == "unknown") {
      const auto line = watch.read_line(kWait);
      ASSERT_TRUE(line) << "no event while the state is unknown";
      state = nlohmann::json::parse(*line)["status"].value("state", "");
    }
  }

  control::Reply ask(testing::LineClient& client, const control::Request& request) {
    if (!client.write(control::encode_request(request))) {
      ADD_FAILURE() << "cannot send " << control::to_string(request.op);
      return {};
    }
    const auto line = client.read_line(kWait);
    if (!line) {
      ADD_FAILURE() << "no reply to " << control::to_string(request.op);
      return {};
    }
    auto reply = control::parse_reply(*line);
    if (!reply) {
      ADD_FAILURE() << "unreadable reply " << *line;
      return {};
    }
    return *reply;
  }

  // The status of pgdata once a cancelled operation has ended (its detail says so), as a `keys`
  // request answers it: the daemon starts that read only between the protocol's batches, and it
  // reads the LU itself.
  // The resource's status once its detail says the operation ended (by default: "cancelled").
  nlohmann::json status_after_cancel(testing::LineClient& client,
                                     const std::string& ended = "cancelled") {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    std::uint64_t id = 100;
    while (std::chrono::steady_clock::now() < deadline) {
      const auto reply = ask(client, request(control::Op::kKeys, "pgdata", ++id));
      if (!reply.ok) {
        return {};
      }
      nlohmann::json status = reply.body["status"];
      if (status.value("detail", "").find(ended) != std::string::npos) {
        return status;
      }
    }
    ADD_FAILURE() << "the operation did not end cancelled";
    return {};
  }

  // Fails the test for each PR OUT that could take a LU and reached the target after since.
  void expect_nothing_taken_since(std::chrono::steady_clock::time_point since,
                                  const std::string& after) {
    for (const auto& command : devices_->stats().log()) {
      EXPECT_FALSE(command.at > since && command.could_take())
          << "PR OUT service action " << int{command.service_action} << " (key "
          << fence::Key::format(command.key) << ", service action key "
          << fence::Key::format(command.sa_key) << ") " << after;
    }
  }

  TempDir dir_;
  std::unique_ptr<testing::SimDevices> devices_;
  std::unique_ptr<testing::DaemonThread> daemon_;
};

TEST_F(SimDaemonTest, AWatcherThatNeverReadsIsDroppedAndTheDaemonGoesOn) {
  start();
  testing::LineClient watcher(socket_path());
  ASSERT_TRUE(watcher.connected());
  // The smallest receive buffer the kernel allows: what it does not take piles up in the daemon.
  const int small = 1;
  (void)::setsockopt(watcher.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ASSERT_TRUE(watcher.write(control::encode_request(request(control::Op::kWatch, "pgdata", 1))));
  // Events (an acquire and a release each bring several) and replies to requests it never reads:
  // a few MiB in all, beyond the 1 MiB the daemon keeps for one client plus the socket buffers.
  await_state_known();
  testing::LineClient root(socket_path());
  const auto acquired = ask(root, request(control::Op::kAcquire, "pgdata", 2));
  ASSERT_TRUE(acquired.ok) << acquired.error->message;
  ASSERT_TRUE(ask(root, request(control::Op::kRelease, "pgdata", 3)).ok);
  std::string flood;
  for (std::uint64_t id = 10; id < 2010; ++id) {
    flood += control::encode_request(request(control::Op::kMetrics, "", id));
  }
  (void)watcher.write(flood);  // the daemon may drop it before it has sent everything
  EXPECT_TRUE(watcher.closed_within(kWait));
  // Everyone else is served, and the daemon still acts.
  testing::LineClient next(socket_path());
  EXPECT_TRUE(ask(next, request(control::Op::kStatus, "", 4)).ok);
  EXPECT_TRUE(ask(root, request(control::Op::kAcquire, "pgdata", 5)).ok);
}

TEST_F(SimDaemonTest, KeysRequestsOfManyClientsShareOneReadAtATime) {
  // 5 ms a command: the requests all arrive while the first read is on the device.
  start(std::chrono::milliseconds(5));
  await_state_known();
  testing::LineClient root(socket_path());
  const auto acquired = ask(root, request(control::Op::kAcquire, "pgdata", 1));
  ASSERT_TRUE(acquired.ok) << acquired.error->message;
  const std::string key = acquired.body.value("key", "");
  constexpr std::size_t kClients = 40;  // root: no per-uid limit
  std::vector<std::unique_ptr<testing::LineClient>> clients;
  for (std::size_t i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<testing::LineClient>(socket_path()));
  }
  devices_->stats().in_flight_max = 0;
  const std::uint64_t commands_before = devices_->stats().commands;
  for (std::size_t i = 0; i < kClients; ++i) {
    ASSERT_TRUE(
        clients[i]->write(control::encode_request(request(control::Op::kKeys, "pgdata", i))));
  }
  for (std::size_t i = 0; i < kClients; ++i) {
    const auto line = clients[i]->read_line(kWait);
    ASSERT_TRUE(line) << "no answer to keys " << i;
    const auto reply = control::parse_reply(*line);
    ASSERT_TRUE(reply && reply->ok) << *line;
    EXPECT_EQ(reply->id, i);
    const auto& lu = reply->body["status"]["lus"][0];
    EXPECT_EQ(lu.value("holder", ""), key) << *line;
    EXPECT_EQ(lu.value("error", nlohmann::json()), nlohmann::json()) << *line;
  }
  // One keys read is READ KEYS and READ RESERVATION; a monitor round is at most the same two.
  EXPECT_LE(devices_->stats().in_flight_max.load(), 4U);
  // The 40 requests cost a handful of reads, not 40 (80 commands), whatever the monitor did.
  const std::uint64_t commands = devices_->stats().commands - commands_before;
  EXPECT_LT(commands, 40U) << commands << " commands";
}

// Another node of the cluster (node 9, epoch 3) holds lu0 before the daemon starts: an acquire
// must register its own key and preempt that one.
constexpr std::uint16_t kOtherNode = 9;
std::uint64_t other_holder() {
  return fence::Key::make(fence::cluster_id_from_name("glue"), kOtherNode, 3)->value();
}
void hold_lu0_by_another_node(testing::SimDevices& devices) {
  const transport::LuId lu = devices.lu("lu0");
  const auto execute = [&](const codec::PrOutCommand& prout) {
    transport::Command command = transport::Command::from_cdb(prout.cdb);
    command.direction = transport::DataDirection::kToDevice;
    command.data_out = prout.parameters;
    // A unit attention (power on) may answer the first command of the nexus.
    std::uint8_t status = 0xff;
    for (int attempt = 0; attempt < 3 && status != 0; ++attempt) {
      status = devices.target().execute(lu, 2, command).status;
    }
    ASSERT_EQ(status, 0);
  };
  execute(codec::prout_register_and_ignore(other_holder()));
  execute(codec::prout_reserve(other_holder(), codec::PrType::kWriteExclusiveRegistrantsOnly));
}

// Slow enough that a step of an acquire is still on the device when the test acts on what it saw
// reach the target, and a command timeout and lease that none of this comes near.
SimDaemonTest::Options slow_lu_held_by_another_node() {
  return {.latency = std::chrono::milliseconds(200),
          .resources = 1,
          .check_interval = std::chrono::milliseconds(1000),
          .lease = std::chrono::milliseconds(10'000),
          .command_timeout = std::chrono::milliseconds(5000),
          .before = hold_lu0_by_another_node,
          .epochs = {}};
}

TEST_F(SimDaemonTest, AnAcquireWhoseCallerWentAwaySendsNoPrOutThatCouldTakeTheLu) {
  start(slow_lu_held_by_another_node());
  await_state_known();
  testing::LineClient caller(socket_path());
  ASSERT_TRUE(caller.write(control::encode_request(request(control::Op::kAcquire, "pgdata", 1))));
  // Mid-operation: our new key's REGISTER has reached the target; its PREEMPT of node 9 is next.
  const auto registered = devices_->stats().await(
      [](const testing::CommandRecord& c) { return c.could_take(); }, kWait);
  ASSERT_TRUE(registered) << "the acquire never registered its key";
  ASSERT_NE(registered->service_action, 0x04) << "a PREEMPT came first";
  caller.close();  // the caller goes away (Patroni killed it)
  const auto gone = std::chrono::steady_clock::now();
  testing::LineClient root(socket_path());
  const nlohmann::json status = status_after_cancel(root);
  expect_nothing_taken_since(gone, "after the caller went away");
  ASSERT_TRUE(status.is_object());
  EXPECT_EQ(status.value("state", ""), "released") << status.dump();
  EXPECT_FALSE(status.value("gate_open", true));
  const auto& lu = status["lus"][0];
  EXPECT_EQ(lu.value("holder", ""), fence::Key::format(other_holder())) << status.dump();
  EXPECT_EQ(lu["keys"], nlohmann::json::array({fence::Key::format(other_holder())}))
      << "our key stays registered: " << status.dump();
}

TEST_F(SimDaemonTest, AnAcquirePastItsTimeoutSendsNoPrOutThatCouldTakeTheLu) {
  start(slow_lu_held_by_another_node());
  await_state_known();
  testing::LineClient caller(socket_path());
  const auto sent = std::chrono::steady_clock::now();
  control::Request acquire = request(control::Op::kAcquire, "pgdata", 1);
  // Passes while the acquire's first read (two commands, 200 ms each) is on the device.
  acquire.timeout = std::chrono::milliseconds(50);
  const auto reply = ask(caller, acquire);
  ASSERT_TRUE(reply.error) << reply.body.dump();
  EXPECT_EQ(reply.error->code, control::ReplyError::kTimeout);
  EXPECT_NE(reply.error->message.find("cancelled"), std::string::npos) << reply.error->message;
  const nlohmann::json status = status_after_cancel(caller);  // the caller stays
  expect_nothing_taken_since(sent, "after the acquire with a deadline was sent");
  ASSERT_TRUE(status.is_object());
  EXPECT_EQ(status.value("state", ""), "released") << status.dump();
  EXPECT_FALSE(status.value("gate_open", true));
  EXPECT_EQ(status["lus"][0].value("holder", ""), fence::Key::format(other_holder()));
}

TEST_F(SimDaemonTest, APromoteWhoseCallerWentAwaySendsNoPrOutThatCouldTakeTheLu) {
  // Primary mode: node 9 is the primary (it holds lu0); this node joins as a member, then its
  // pre_promote starts a promote and is killed mid-way.
  SimDaemonTest::Options options = slow_lu_held_by_another_node();
  options.mode = Mode::kPrimary;
  start(options);
  await_state_known();
  testing::LineClient root(socket_path());
  const auto joined = ask(root, request(control::Op::kUnfence, "pgdata", 1));
  ASSERT_TRUE(joined.ok) << joined.body.dump();
  testing::LineClient caller(socket_path());
  const auto sent = std::chrono::steady_clock::now();
  ASSERT_TRUE(caller.write(control::encode_request(request(control::Op::kPromote, "pgdata", 2))));
  // Mid-operation: the promote's first PR OUT that could take (its re-key) reached the target.
  const auto first = devices_->stats().await(
      [sent](const testing::CommandRecord& c) { return c.at > sent && c.could_take(); }, kWait);
  ASSERT_TRUE(first) << "the promote sent no PR OUT";
  ASSERT_NE(first->service_action, 0x04) << "a PREEMPT came first";
  ASSERT_NE(first->service_action, 0x05) << "a PREEMPT AND ABORT came first";
  caller.close();
  const auto gone = std::chrono::steady_clock::now();
  // A cancelled promote leaves a member a member (docs/protocol.md, "Primary mode").
  const nlohmann::json status = status_after_cancel(root, "promote failed");
  expect_nothing_taken_since(gone, "after the caller went away");
  ASSERT_TRUE(status.is_object());
  EXPECT_EQ(status.value("state", ""), "unfenced") << status.dump();
  EXPECT_NE(status.value("detail", "").find("still a member"), std::string::npos) << status.dump();
  EXPECT_EQ(status["lus"][0].value("holder", ""), fence::Key::format(other_holder()))
      << "the old primary still holds: " << status.dump();
}

// The epoch file's fsync stalls for ten check intervals (a disk that stops answering).
constexpr std::chrono::milliseconds kStall{1000};
std::unique_ptr<fence::EpochStore> stalling_epoch_store(const std::string& state_dir) {
  auto calls = fence::EpochFileCalls::system();
  const auto fsync = calls.fsync;
  calls.fsync = [fsync](int fd) {
    std::this_thread::sleep_for(kStall);
    return fsync(fd);
  };
  return fence::make_file_epoch_store(state_dir, std::move(calls));
}

TEST_F(SimDaemonTest, AStalledEpochFsyncDoesNotHoldUpTheMonitorOfAnotherResource) {
  Options options;
  options.resources = 2;  // pgdata on lu0, pgwal on lu1
  options.check_interval = std::chrono::milliseconds(100);
  options.epochs = stalling_epoch_store;
  start(options);
  await_state_known("pgdata");
  await_state_known("pgwal");
  const auto from = std::chrono::steady_clock::now();
  testing::LineClient root(socket_path());
  // pgdata's acquire stores its epoch before its REGISTER, and the store stalls: it fails once
  // the loop stops waiting, before anything is registered.
  const auto acquired = ask(root, request(control::Op::kAcquire, "pgdata", 1));
  EXPECT_TRUE(acquired.error && acquired.error->message.find("stalled disk") != std::string::npos)
      << (acquired.error ? acquired.error->message : acquired.body.dump());
  for (const auto& command : devices_->stats().log()) {
    EXPECT_FALSE(command.at > from && command.device == "/dev/sim-lu0" && command.could_take())
        << "a PR OUT of the acquire whose epoch store failed";
  }
  // pgwal's monitor reads lu1 every check interval all through the stall.
  const auto until = from + 2 * kStall;
  ASSERT_TRUE(devices_->stats().await(
      [&](const testing::CommandRecord& c) { return c.device == "/dev/sim-lu1" && c.at > until; },
      kWait));
  auto last = from;
  std::chrono::steady_clock::duration longest{0};
  for (const auto& command : devices_->stats().log()) {
    if (command.device != "/dev/sim-lu1" || command.at <= from) {
      continue;
    }
    longest = std::max(longest, command.at - last);
    last = command.at;
    if (command.at > until) {
      break;
    }
  }
  // Generous: five check intervals, where a loop stalled on the fsync goes quiet for kStall.
  EXPECT_LT(longest, 5 * options.check_interval)
      << std::chrono::duration_cast<std::chrono::milliseconds>(longest).count()
      << " ms without a command of pgwal's monitor";
}

}  // namespace
}  // namespace blkfence::daemon

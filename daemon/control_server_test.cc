// Proves the control socket's transport (control_server.h, docs/control-protocol.md "Framing" and
// "Limits") on a real socket in a temporary directory: the socket is bound mode 0666 over a stale
// file and removed on destruction; lines reach the handler whole and in order, with the peer's
// SO_PEERCRED credentials, however the bytes are split; a line over the limit is reported once as
// too large and skipped to its end; a client that disconnects mid-line or with replies unread, that
// leaves a partial line hanging, or that stops reading its replies is dropped and the server goes
// on serving others; the 65th client is told "busy" (a reply of the real protocol) and closed, and
// a place freed is a place taken; close_after_send delivers what is queued, then closes.
// Under abuse (docs/control-protocol.md "Limits"): unprivileged peers cannot take the places kept
// for privileged ones; one uid other than root holds at most kMaxPerUid connections; a silent
// client owed nothing is dropped after the idle timeout, one the handler holds is not; one wake-up
// handles at most kLineBudget lines of a client, so a flood from one does not delay another's
// line; and accept(2) failing with EMFILE pauses the listening socket instead of spinning on it,
// and the waiting client is served once descriptors are free. The tests that need connections of
// several uids switch this thread's effective uid (SO_PEERCRED reports it), so they need root and
// skip otherwise.
#include "control_server.h"

#include <algorithm>
#include <memory>
#include <vector>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "blkfence/control/protocol.h"

#include "glue_testing.h"
#include "log.h"

namespace blkfence::daemon {
namespace {

using testing::RawClient;
using testing::run_until;
using testing::TempDir;

// While it lives, connections this thread makes carry uid in SO_PEERCRED, which reports the
// connecting thread's effective uid: the raw system call changes this thread's alone, and the
// saved uid 0 lets it come back. Root only.
class AsUid {
 public:
  explicit AsUid(uid_t uid) { EXPECT_EQ(::syscall(SYS_setresuid, -1, uid, -1), 0); }
  ~AsUid() { EXPECT_EQ(::syscall(SYS_setresuid, -1, 0, -1), 0); }
  AsUid(const AsUid&) = delete;
  AsUid& operator=(const AsUid&) = delete;
};

constexpr uid_t kNobody = 65534;

struct Received {
  ClientId client = 0;
  Peer peer;
  std::string line;
  bool too_large = false;
};

// Answers "echo:LINE"; "bye" is answered "ciao" and the connection closed after it; "big" is
// answered with kBigReply bytes; "hold" holds the client (as blkfenced does for a `watch`) and is
// answered "held"; a line too large is answered "too-large" and, when close_on_too_large, the
// connection closed (as blkfenced does). Peers are privileged while privileged_peers is set.
class Handler final : public ControlHandler {
 public:
  static constexpr std::size_t kBigReply = 64 * 1024;

  void on_line(ClientId client, const Peer& peer, std::string_view line, bool too_large) override {
    received.push_back(
        {.client = client, .peer = peer, .line = std::string(line), .too_large = too_large});
    if (too_large) {
      server->send(client, "too-large\n");
      if (close_on_too_large) {
        server->close_after_send(client);
      }
    } else if (line == "bye") {
      server->send(client, "ciao\n");
      server->close_after_send(client);
    } else if (line == "hold") {
      server->hold(client);
      server->send(client, "held\n");
    } else if (line == "big") {
      server->send(client, std::string(kBigReply - 1, 'b') + "\n");
    } else {
      server->send(client, "echo:" + std::string(line) + "\n");
    }
  }
  void on_disconnect(ClientId client) override { disconnected.push_back(client); }
  bool privileged(const Peer&) override { return privileged_peers; }

  ControlServer* server = nullptr;
  bool privileged_peers = true;
  bool close_on_too_large = false;
  std::vector<Received> received;
  std::vector<ClientId> disconnected;
};

class ControlServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(sd_event_new(&event_), 0);
    path_ = dir_ / "control.sock";
  }
  void TearDown() override {
    server_.reset();
    sd_event_unref(event_);
  }
  void start(ControlTimeouts timeouts = {}) {
    auto made = ControlServer::make(event_, path_, handler_, timeouts);
    ASSERT_TRUE(made) << made.error().message();
    server_ = std::move(*made);
    handler_.server = server_.get();
  }
  std::unique_ptr<RawClient> connect() {
    auto client = std::make_unique<RawClient>(event_, path_);
    return client;
  }
  // Connects and waits until the server has accepted (count grows by one).
  std::unique_ptr<RawClient> connect_accepted() {
    const std::size_t before = server_->client_count();
    auto client = connect();
    run_until(
        event_, [&] { return server_->client_count() == before + 1; }, "accept");
    return client;
  }

  TempDir dir_;
  std::string path_;
  sd_event* event_ = nullptr;
  Handler handler_;
  std::unique_ptr<ControlServer> server_;
};

TEST_F(ControlServerTest, LimitsAreTheProtocolsDocumentedOnes) {
  // docs/control-protocol.md, "Limits": 64 KiB lines, 64 clients of which 8 places are kept for
  // privileged peers, 16 per uid, 1 MiB unread, 5 s partial line, 30 s idle, 64 KiB and 16 lines
  // per wake-up, 1 s accept pause.
  EXPECT_EQ(ControlServer::kMaxLineSize, 65536U);
  EXPECT_EQ(ControlServer::kMaxClients, 64U);
  EXPECT_EQ(ControlServer::kReservedPrivileged, 8U);
  EXPECT_EQ(ControlServer::kMaxPerUid, 16U);
  EXPECT_EQ(ControlServer::kMaxQueued, 1024U * 1024U);
  EXPECT_EQ(ControlServer::kReadBudget, 65536U);
  EXPECT_EQ(ControlServer::kLineBudget, 16U);
  const ControlTimeouts timeouts;
  EXPECT_EQ(timeouts.partial_line, std::chrono::seconds(5));
  EXPECT_EQ(timeouts.idle, std::chrono::seconds(30));
  EXPECT_EQ(timeouts.accept_pause, std::chrono::seconds(1));
}

TEST_F(ControlServerTest, BindsMode0666OverAStaleFileAndRemovesTheSocketWhenDestroyed) {
  {
    const UniqueFd stale(::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(stale.valid());
  }
  start();
  struct stat st {};
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0666U);
  server_.reset();
  EXPECT_NE(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(ControlServerTest, RefusesAPathTooLongForAUnixSocket) {
  auto made = ControlServer::make(event_, dir_ / std::string(200, 'x'), handler_);
  ASSERT_FALSE(made);
  EXPECT_EQ(made.error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(ControlServerTest, ALineReachesTheHandlerWithThePeersCredentialsAndIsAnswered) {
  start();
  auto client = connect();
  client->write("hello\n");
  EXPECT_EQ(client->read_line(), "echo:hello");
  ASSERT_EQ(handler_.received.size(), 1U);
  const Received& got = handler_.received[0];
  EXPECT_EQ(got.line, "hello");
  EXPECT_FALSE(got.too_large);
  EXPECT_EQ(got.peer.pid, ::getpid());
  EXPECT_EQ(got.peer.uid, ::getuid());
  EXPECT_EQ(got.peer.gid, ::getgid());
  // SO_PEERGROUPS: the supplementary groups this process has.
  std::vector<gid_t> groups(static_cast<std::size_t>(::getgroups(0, nullptr)));
  groups.resize(
      static_cast<std::size_t>(::getgroups(static_cast<int>(groups.size()), groups.data())));
  EXPECT_EQ(got.peer.groups, groups);
}

TEST_F(ControlServerTest, LinesArriveWholeAndInOrderHoweverTheBytesAreSplit) {
  start();
  auto client = connect();
  client->write("one\ntwo\nthr");
  EXPECT_EQ(client->read_line(), "echo:one");
  EXPECT_EQ(client->read_line(), "echo:two");
  client->write("ee\n\n");
  EXPECT_EQ(client->read_line(), "echo:three");
  EXPECT_EQ(client->read_line(), "echo:");  // an empty line is a line: the handler judges it
  ASSERT_EQ(handler_.received.size(), 4U);
  EXPECT_EQ(handler_.received[2].line, "three");
  EXPECT_EQ(handler_.received[0].client, handler_.received[3].client);
}

TEST_F(ControlServerTest, ALineOfExactlyTheLimitIsALine) {
  start();
  auto client = connect();
  client->write(std::string(ControlServer::kMaxLineSize, 'x') + "\n");
  const auto reply = client->read_line();
  ASSERT_TRUE(reply);
  EXPECT_EQ(reply->size(), 5 + ControlServer::kMaxLineSize);
  ASSERT_EQ(handler_.received.size(), 1U);
  EXPECT_FALSE(handler_.received[0].too_large);
}

TEST_F(ControlServerTest, ALineOverTheLimitIsReportedOnceAndSkippedToItsEnd) {
  start();
  auto client = connect();
  client->write(std::string(3 * ControlServer::kMaxLineSize, 'x'));
  EXPECT_EQ(client->read_line(), "too-large");
  client->write(std::string(ControlServer::kMaxLineSize, 'x') + "\nnext\n");
  EXPECT_EQ(client->read_line(), "echo:next");
  ASSERT_EQ(handler_.received.size(), 2U);
  EXPECT_TRUE(handler_.received[0].too_large);
  EXPECT_TRUE(handler_.received[0].line.empty());
  EXPECT_EQ(handler_.received[1].line, "next");
}

TEST_F(ControlServerTest, CloseAfterSendDeliversWhatIsQueuedThenCloses) {
  start();
  auto client = connect();
  client->write("bye\nignored\n");
  EXPECT_EQ(client->read_line(), "ciao");
  EXPECT_TRUE(client->await_eof());
  EXPECT_TRUE(client->unread().empty());
  ASSERT_EQ(handler_.received.size(), 1U);  // nothing after "bye" is handled
  EXPECT_EQ(handler_.disconnected.size(), 1U);
  EXPECT_EQ(server_->client_count(), 0U);
}

TEST_F(ControlServerTest, APeerThatLeavesMidLineIsDroppedAndTheServerGoesOn) {
  start();
  auto leaving = connect_accepted();
  leaving->write("half a requ");
  leaving->close();
  run_until(
      event_, [&] { return handler_.disconnected.size() == 1; }, "the drop");
  EXPECT_TRUE(handler_.received.empty());  // the half line is not a line
  EXPECT_EQ(server_->client_count(), 0U);
  auto next = connect();
  next->write("still there?\n");
  EXPECT_EQ(next->read_line(), "echo:still there?");
}

TEST_F(ControlServerTest, APeerThatLeavesWithRepliesUnreadIsDroppedAndTheServerGoesOn) {
  start();
  auto leaving = connect_accepted();
  leaving->write("big\nbig\nbig\nbig\nbig\nbig\nbig\nbig\n");
  leaving->close();
  run_until(
      event_, [&] { return handler_.disconnected.size() == 1; }, "the drop");
  EXPECT_EQ(server_->client_count(), 0U);
  auto next = connect();
  next->write("ok\n");
  EXPECT_EQ(next->read_line(), "echo:ok");
}

TEST_F(ControlServerTest, APartialLineLeftHangingIsDroppedAfterTheIdleTimeout) {
  start({.partial_line = std::chrono::milliseconds(50),
         .idle = std::chrono::seconds(60),
         .accept_pause = std::chrono::seconds(1)});
  auto hanging = connect_accepted();
  auto quiet = connect_accepted();
  quiet->write("complete\n");
  EXPECT_EQ(quiet->read_line(), "echo:complete");
  hanging->write("part");
  EXPECT_TRUE(hanging->await_eof());
  ASSERT_EQ(handler_.disconnected.size(), 1U);
  // Only the one with a partial line: a client between complete lines may stay as long as it likes.
  EXPECT_EQ(server_->client_count(), 1U);
  quiet->write("again\n");
  EXPECT_EQ(quiet->read_line(), "echo:again");
}

TEST_F(ControlServerTest, AClientThatStopsReadingIsDroppedBeyondTheQueueLimit) {
  start();
  auto stalled = connect_accepted();
  auto other = connect_accepted();
  // Twice the queue limit in replies, and never a read: what the socket buffer does not take
  // piles up in the server until it passes kMaxQueued.
  const std::size_t requests = 2 * ControlServer::kMaxQueued / Handler::kBigReply;
  std::string burst;
  for (std::size_t i = 0; i < requests; ++i) {
    burst += "big\n";
  }
  stalled->write(burst);
  run_until(
      event_, [&] { return handler_.disconnected.size() == 1; }, "the drop");
  EXPECT_EQ(server_->counters().dropped_unread, 1U);
  EXPECT_EQ(server_->client_count(), 1U);
  other->write("ok\n");
  EXPECT_EQ(other->read_line(), "echo:ok");
}

TEST_F(ControlServerTest, TheClientOverTheLimitIsToldBusyAndClosedAndAFreedPlaceIsTaken) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root: a uid other than root may hold only kMaxPerUid connections";
  }
  start();
  std::vector<std::unique_ptr<RawClient>> clients;
  for (std::size_t i = 0; i < ControlServer::kMaxClients; ++i) {
    clients.push_back(connect_accepted());
  }
  ASSERT_EQ(server_->client_count(), ControlServer::kMaxClients);
  auto extra = connect();
  const auto line = extra->read_line();
  ASSERT_TRUE(line);
  const auto reply = control::parse_reply(*line);
  ASSERT_TRUE(reply) << reply.error();
  EXPECT_FALSE(reply->ok);
  EXPECT_EQ(reply->id, std::nullopt);
  ASSERT_TRUE(reply->error);
  EXPECT_EQ(reply->error->code, control::ReplyError::kBusy);
  EXPECT_TRUE(extra->await_eof());
  EXPECT_EQ(server_->client_count(), ControlServer::kMaxClients);
  // Everyone admitted is still served.
  clients.back()->write("last\n");
  EXPECT_EQ(clients.back()->read_line(), "echo:last");
  // One leaves; the next one in is served.
  clients.front()->close();
  run_until(
      event_, [&] { return handler_.disconnected.size() == 1; }, "the drop");
  auto next = connect();
  next->write("in\n");
  EXPECT_EQ(next->read_line(), "echo:in");
}

// The busy error a refused client reads before the server closes the connection.
std::string refusal_of(RawClient& client) {
  const auto line = client.read_line();
  if (!line) {
    ADD_FAILURE() << "no reply to a refused connection";
    return {};
  }
  const auto reply = control::parse_reply(*line);
  if (!reply || !reply->error) {
    ADD_FAILURE() << "not an error: " << *line;
    return {};
  }
  EXPECT_EQ(reply->error->code, control::ReplyError::kBusy);
  EXPECT_TRUE(client.await_eof());
  return reply->error->message;
}

TEST_F(ControlServerTest, UnprivilegedPeersCannotTakeThePlacesKeptForPrivilegedOnes) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root: a uid other than root may hold only kMaxPerUid connections";
  }
  start();
  handler_.privileged_peers = false;
  std::vector<std::unique_ptr<RawClient>> clients;
  for (std::size_t i = 0; i < ControlServer::kMaxClients - ControlServer::kReservedPrivileged;
       ++i) {
    clients.push_back(connect_accepted());
  }
  auto unprivileged = connect();
  EXPECT_NE(refusal_of(*unprivileged).find("kept for peers that may change state"),
            std::string::npos);
  EXPECT_EQ(server_->counters().refused_busy, 1U);
  // The reserved places take privileged peers, up to the total.
  handler_.privileged_peers = true;
  for (std::size_t i = 0; i < ControlServer::kReservedPrivileged; ++i) {
    clients.push_back(connect_accepted());
  }
  EXPECT_EQ(server_->client_count(), ControlServer::kMaxClients);
  auto privileged = connect();
  (void)refusal_of(*privileged);
  EXPECT_EQ(server_->counters().refused_busy, 2U);
  clients.back()->write("served\n");
  EXPECT_EQ(clients.back()->read_line(), "echo:served");
}

TEST_F(ControlServerTest, OneUidOtherThanRootHoldsAtMostItsShare) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root: connections of several uids";
  }
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);  // let the other uids reach the socket
  start();
  std::vector<std::unique_ptr<RawClient>> clients;
  {
    const AsUid nobody(kNobody);
    for (std::size_t i = 0; i < ControlServer::kMaxPerUid; ++i) {
      clients.push_back(connect_accepted());
    }
    auto extra = connect();
    EXPECT_NE(refusal_of(*extra).find("too many connections from uid 65534"), std::string::npos);
    EXPECT_EQ(server_->counters().refused_per_uid, 1U);
  }
  {
    const AsUid other(kNobody - 1);  // another user is not held back by the first one's use
    clients.push_back(connect_accepted());
  }
  clients.push_back(connect_accepted());  // nor is root
  EXPECT_EQ(server_->client_count(), ControlServer::kMaxPerUid + 2);
  // A place the uid gives back is one it may take again.
  clients.front()->close();
  run_until(
      event_, [&] { return handler_.disconnected.size() == 1; }, "the drop");
  {
    const AsUid nobody(kNobody);
    clients.push_back(connect_accepted());
  }
  clients.back()->write("in\n");
  EXPECT_EQ(clients.back()->read_line(), "echo:in");
}

TEST_F(ControlServerTest, ASilentClientOwedNothingIsDroppedAfterTheIdleTimeoutAHeldOneIsNot) {
  start({.partial_line = std::chrono::seconds(5),
         .idle = std::chrono::milliseconds(100),
         .accept_pause = std::chrono::seconds(1)});
  auto held = connect_accepted();
  held->write("hold\n");
  EXPECT_EQ(held->read_line(), "held");
  auto silent = connect_accepted();
  EXPECT_TRUE(silent->await_eof());
  // A second silent one, connected after the first was dropped: by its drop the held client has
  // been silent for two idle timeouts.
  auto later = connect_accepted();
  EXPECT_TRUE(later->await_eof());
  EXPECT_EQ(server_->counters().dropped_idle, 2U);
  EXPECT_EQ(server_->client_count(), 1U);
  held->write("still here\n");
  EXPECT_EQ(held->read_line(), "echo:still here");
}

TEST_F(ControlServerTest, OneWakeUpHandlesAtMostTheLineBudgetSoAFloodDoesNotDelayAnother) {
  start();
  auto flood = connect_accepted();
  auto other = connect_accepted();
  constexpr std::size_t kFlood = 1000;
  std::string lines;
  for (std::size_t i = 0; i < kFlood; ++i) {
    lines += "f\n";
  }
  flood->write(lines);
  run_until(
      event_, [&] { return !handler_.received.empty(); }, "the flood being served");
  other->write("o\n");
  EXPECT_EQ(other->read_line(), "echo:o");
  const auto o = std::find_if(handler_.received.begin(), handler_.received.end(),
                              [](const Received& r) { return r.line == "o"; });
  ASSERT_NE(o, handler_.received.end());
  // The flood's first wake-up, and at most a few more while the other line waited its turn.
  EXPECT_LE(o - handler_.received.begin(), 4 * static_cast<long>(ControlServer::kLineBudget));
  // The flood is served in full all the same.
  run_until(
      event_, [&] { return handler_.received.size() == kFlood + 1; }, "the rest of the flood");
}

TEST_F(ControlServerTest, EmfileOnAcceptPausesTheListeningSocketThenTheClientIsServed) {
  constexpr auto kPause = std::chrono::milliseconds(200);
  start({.partial_line = std::chrono::seconds(5),
         .idle = std::chrono::seconds(60),
         .accept_pause = kPause});
  auto waiting = connect();  // its descriptor is taken before the table is full
  // The shortage is logged, and the log's writer thread starts with the first record. A thread
  // started with no descriptor left trips UBSan's vptr check in the sanitizer build (its memory
  // probe needs a pipe: "object has invalid vptr"), so the writer starts here, as in blkfenced,
  // which logs long before its descriptors can run out.
  log(Priority::kInfo, "the EMFILE test starts");
  ASSERT_TRUE(flush_log(std::chrono::seconds(5)));
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 256);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<UniqueFd> filler;
  for (rlim_t i = 0; i < low.rlim_cur; ++i) {
    UniqueFd fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      ASSERT_EQ(errno, EMFILE);
      break;
    }
    filler.push_back(std::move(fd));
  }
  const auto started = std::chrono::steady_clock::now();
  run_until(
      event_, [&] { return server_->counters().accept_failures >= 3; },
      "accept to be tried again after its pauses");
  const auto elapsed = std::chrono::steady_clock::now() - started;
  // One try per pause, not one per loop iteration; one shortage, one log line.
  EXPECT_LE(server_->counters().accept_failures, static_cast<std::uint64_t>(elapsed / kPause) + 2U);
  EXPECT_EQ(server_->counters().accept_shortages, 1U);
  filler.clear();
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  waiting->write("in\n");
  EXPECT_EQ(waiting->read_line(), "echo:in");
  EXPECT_EQ(server_->client_count(), 1U);
}

}  // namespace
}  // namespace blkfence::daemon

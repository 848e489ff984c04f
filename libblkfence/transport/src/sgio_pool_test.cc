// Proves the SG_IO thread pool through its ioctl seam (FakeSgIo in fake_sg.h): answers, sense,
// data and errno come back to the right tags; never more SG_IO calls at once than threads, and 40
// commands all complete; an SG_IO stuck past its deadline is kIndeterminate while the others
// complete, and its late result is dropped (its buffers still alive when it writes them, which the
// asan preset checks); a command that never got a worker is never run; close_path() reports
// running commands kIndeterminate, cancels queued ones, and keeps the fd open until the worker
// returns, then closes it; destroying the transport does not wait for a stuck worker; a path whose
// SG_IO never returns holds at most per_path_max workers while another path's commands complete,
// and a worker stuck past its command's deadline gets a replacement.
#include <map>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include "blkfence/testing/fake_sg.h"

#include "transport_impl.h"

namespace blkfence::transport::test {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLong{10'000};
constexpr milliseconds kShort{100};
constexpr milliseconds kGrace{20};

std::map<std::uint64_t, Completion> by_tag(std::vector<Completion> completions) {
  std::map<std::uint64_t, Completion> map;
  for (Completion& completion : completions) {
    const std::uint64_t tag = completion.tag;
    EXPECT_TRUE(map.emplace(tag, std::move(completion)).second) << "tag " << tag << " came twice";
  }
  return map;
}

FakeReply good_reply(std::uint32_t marker) {
  FakeReply reply;
  reply.data_in = {static_cast<std::uint8_t>(marker), 0x5a};
  return reply;
}

// The fake's script answers from the marker: 0 blocks until released, others answer at once.
std::optional<FakeReply> block_marker_zero(const FakeRequest& request) {
  if (marker_of(request) == 0) {
    return std::nullopt;
  }
  return good_reply(marker_of(request));
}

std::optional<FakeReply> block_all(const FakeRequest&) {
  return std::nullopt;
}

struct Pool {
  std::shared_ptr<FakeSgIo> fake;
  std::unique_ptr<detail::TransportImpl> transport;
  PathId path = 0;
  int fd = -1;  // the path's fd number, for checking when it closes
};

// A transport on threads workers whose SG_IO is fake, with one path on an eventfd.
Pool make_pool(std::size_t threads, FakeScript script, std::size_t per_path_max = 2) {
  Pool pool;
  pool.fake = std::make_shared<FakeSgIo>(std::move(script));
  detail::SgioOptions options;
  options.threads = threads;
  options.per_path_max = per_path_max;
  options.deadline_grace = kGrace;
  // The transport (and a worker it leaves behind) keeps the fake alive through this copy.
  options.sg_io = [fake = pool.fake](int fd, sg_io_hdr& header) { return (*fake)(fd, header); };
  auto made = detail::make_sgio_transport(options);
  EXPECT_TRUE(made.has_value());
  pool.transport = std::move(*made);
  UniqueFd fd(::eventfd(0, EFD_CLOEXEC));
  pool.fd = fd.get();
  pool.path = pool.transport->open_path_fd(std::move(fd), "fake-sg").value();
  return pool;
}

void submit(Transport& transport, PathId path, Command command) {
  const auto submitted = transport.submit(path, std::move(command));
  ASSERT_TRUE(submitted.has_value()) << submitted.error().message();
}

TEST(SgioPool, AnswersSenseDataAndErrnoReachTheirTags) {
  Pool pool = make_pool(4, [](const FakeRequest& request) -> std::optional<FakeReply> {
    FakeReply reply;
    switch (marker_of(request)) {
      case 0: reply.data_in = {9, 8, 7}; break;
      case 1:
        reply.status = 0x02;
        reply.driver_status = 0x08;
        reply.sense = {0x70, 0, 0x05, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0x24, 0x00};
        break;
      case 2: reply.status = 0x18; break;
      case 3: reply.sg_io_result = -EPERM; break;  // sd without CAP_SYS_RAWIO
      case 4: reply.sg_io_result = -EINTR; break;  // an orphaned SG_IO
      default: reply.host_status = 0x01; break;    // DID_NO_CONNECT
    }
    return reply;
  });
  for (std::uint32_t marker = 0; marker < 6; ++marker) {
    submit(*pool.transport, pool.path, marked_command(marker, 10 + marker, kLong));
  }
  auto done = by_tag(reap_count(*pool.transport, 6));
  ASSERT_EQ(done.size(), 6U);
  EXPECT_EQ(done[10].outcome, Outcome::kGood);
  EXPECT_EQ(done[10].data_in, (std::vector<std::uint8_t>{9, 8, 7}));
  EXPECT_EQ(done[11].outcome, Outcome::kCheckCondition);
  EXPECT_EQ(done[11].sense.size(), 14U);
  EXPECT_EQ(done[11].sense[12], 0x24);
  EXPECT_EQ(done[12].outcome, Outcome::kReservationConflict);
  EXPECT_EQ(done[13].outcome, Outcome::kOsError);
  EXPECT_EQ(done[13].os_errno, EPERM);
  EXPECT_EQ(done[14].outcome, Outcome::kIndeterminate);
  EXPECT_EQ(done[14].os_errno, EINTR);
  EXPECT_EQ(done[15].outcome, Outcome::kTransportError);
  EXPECT_EQ(done[15].host_status, 0x01);
  EXPECT_EQ(pool.transport->in_flight(), 0U);
  for (const FakeRequest& request : pool.fake->received()) {
    EXPECT_EQ(request.fd, pool.fd);
    EXPECT_EQ(request.timeout_ms, 10'000U);
  }
}

TEST(SgioPool, NeverMoreCallsAtOnceThanThreadsAndFortyAllComplete) {
  constexpr std::size_t kThreads = 3;
  constexpr std::uint32_t kCommands = 40;
  Pool pool = make_pool(kThreads, block_all, kThreads);
  for (std::uint32_t marker = 0; marker < kCommands; ++marker) {
    submit(*pool.transport, pool.path, marked_command(marker, marker, kLong));
  }
  std::vector<Completion> completions;
  while (completions.size() < kCommands) {
    ASSERT_TRUE(
        pool.fake->wait_blocked(std::min<std::size_t>(kThreads, kCommands - completions.size())));
    std::map<std::int32_t, std::uint32_t> marker_of_pack;
    for (const FakeRequest& request : pool.fake->received()) {
      marker_of_pack[request.pack_id] = marker_of(request);
    }
    const auto blocked = pool.fake->blocked();
    for (auto it = blocked.rbegin(); it != blocked.rend(); ++it) {
      pool.fake->release(*it, good_reply(marker_of_pack[*it]));
    }
    const auto reaped = reap_count(*pool.transport, blocked.size());
    ASSERT_EQ(reaped.size(), blocked.size());
    completions.insert(completions.end(), reaped.begin(), reaped.end());
  }
  EXPECT_EQ(pool.fake->running_max(), kThreads);
  const auto done = by_tag(completions);
  ASSERT_EQ(done.size(), kCommands);
  for (const auto& [tag, completion] : done) {
    EXPECT_EQ(completion.outcome, Outcome::kGood);
    EXPECT_EQ(completion.data_in.at(0), static_cast<std::uint8_t>(tag));
  }
}

TEST(SgioPool, StuckSgIoIsIndeterminateAndItsLateResultIsDropped) {
  Pool pool = make_pool(2, block_marker_zero);
  submit(*pool.transport, pool.path, marked_command(0, 1, kShort, 64));
  ASSERT_TRUE(pool.fake->wait_blocked(1));
  submit(*pool.transport, pool.path, marked_command(1, 2, kLong));
  submit(*pool.transport, pool.path, marked_command(2, 3, kLong));
  auto done = by_tag(reap_count(*pool.transport, 3));
  ASSERT_EQ(done.size(), 3U);
  EXPECT_EQ(done[1].outcome, Outcome::kIndeterminate);
  EXPECT_GE(done[1].latency, kShort);
  EXPECT_EQ(done[2].outcome, Outcome::kGood);
  EXPECT_EQ(done[3].outcome, Outcome::kGood);
  EXPECT_EQ(pool.transport->zombie_count(), 1U);
  EXPECT_EQ(pool.transport->in_flight(), 0U);

  // SG_IO returns late and writes sense and data through the dropped command's pointers.
  FakeReply late;
  late.status = 0x02;
  late.sense.assign(18, 0x70);
  late.data_in.assign(64, 0xee);
  pool.fake->release(pool.fake->blocked().at(0), late);
  std::vector<Completion> extra;
  const auto give_up = std::chrono::steady_clock::now() + kFakeWaitMax;
  while (pool.transport->zombie_count() > 0 && std::chrono::steady_clock::now() < give_up) {
    ASSERT_TRUE(pool.transport->reap(milliseconds(20), extra).has_value());
  }
  EXPECT_EQ(pool.transport->zombie_count(), 0U);
  ASSERT_TRUE(pool.transport->reap(milliseconds(0), extra).has_value());
  EXPECT_TRUE(extra.empty()) << "the late result completed tag " << extra.at(0).tag << " again";
}

TEST(SgioPool, CommandThatNeverGotAWorkerIsNeverRun) {
  constexpr std::uint32_t kSentinel = 7;
  Pool pool = make_pool(1, block_marker_zero);
  submit(*pool.transport, pool.path, marked_command(0, 1, kLong));
  ASSERT_TRUE(pool.fake->wait_blocked(1));
  submit(*pool.transport, pool.path, marked_command(5, 2, kShort));
  const auto expired = reap_count(*pool.transport, 1);
  ASSERT_EQ(expired.size(), 1U);
  EXPECT_EQ(expired[0].tag, 2U);
  EXPECT_EQ(expired[0].outcome, Outcome::kOsError);
  EXPECT_EQ(expired[0].os_errno, ETIMEDOUT);

  pool.fake->release(pool.fake->blocked().at(0), good_reply(0));
  ASSERT_EQ(reap_count(*pool.transport, 1).size(), 1U);
  // One worker runs jobs in order: once the sentinel has run, the expired one would have too.
  submit(*pool.transport, pool.path, marked_command(kSentinel, 3, kLong));
  const auto sentinel = reap_count(*pool.transport, 1);
  ASSERT_EQ(sentinel.size(), 1U);
  EXPECT_EQ(sentinel[0].tag, 3U);
  const auto received = pool.fake->received();
  ASSERT_EQ(received.size(), 2U);
  EXPECT_EQ(marker_of(received[0]), 0U);
  EXPECT_EQ(marker_of(received[1]), kSentinel);
}

TEST(SgioPool, ClosePathKeepsTheFdOpenUntilTheWorkersReturn) {
  Pool pool = make_pool(2, block_all);
  for (std::uint32_t marker = 0; marker < 3; ++marker) {  // 2 running, 1 queued
    submit(*pool.transport, pool.path, marked_command(marker, marker, kLong));
  }
  ASSERT_TRUE(pool.fake->wait_blocked(2));
  pool.transport->close_path(pool.path);
  std::vector<Completion> closed;
  ASSERT_TRUE(pool.transport->reap(milliseconds(0), closed).has_value());
  auto done = by_tag(closed);
  ASSERT_EQ(done.size(), 3U);
  EXPECT_EQ(done[0].outcome, Outcome::kIndeterminate);
  EXPECT_EQ(done[1].outcome, Outcome::kIndeterminate);
  EXPECT_EQ(done[2].outcome, Outcome::kOsError);
  EXPECT_EQ(done[2].os_errno, ECANCELED);
  EXPECT_EQ(pool.transport->submit(pool.path, marked_command(9, 9, kLong)).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_NE(::fcntl(pool.fd, F_GETFD), -1) << "closed under a running SG_IO";

  for (const std::int32_t pack_id : pool.fake->blocked()) {
    pool.fake->release(pack_id, FakeReply{});
  }
  ASSERT_TRUE(pool.fake->wait_returned(2));
  const auto give_up = std::chrono::steady_clock::now() + kFakeWaitMax;
  std::vector<Completion> extra;
  while (pool.transport->zombie_count() > 0 && std::chrono::steady_clock::now() < give_up) {
    ASSERT_TRUE(pool.transport->reap(milliseconds(20), extra).has_value());
  }
  EXPECT_TRUE(extra.empty());
  EXPECT_TRUE(pool.fake->fd_was_open_at_every_return());
  EXPECT_EQ(::fcntl(pool.fd, F_GETFD), -1) << "the fd outlived the last command on it";
  EXPECT_EQ(pool.fake->received().size(), 2U) << "the cancelled command ran";
}

TEST(SgioPool, DestroyingDoesNotWaitForAStuckWorker) {
  Pool pool = make_pool(2, block_all);
  submit(*pool.transport, pool.path, marked_command(0, 1, kLong));
  ASSERT_TRUE(pool.fake->wait_blocked(1));
  pool.transport.reset();  // must return with the worker still inside SG_IO
  const std::int32_t pack_id = pool.fake->blocked().at(0);
  pool.fake->release(pack_id, good_reply(0));
  EXPECT_TRUE(pool.fake->wait_returned(1));
}

// A second path on its own eventfd.
PathId add_path(Pool& pool) {
  return pool.transport->open_path_fd(UniqueFd(::eventfd(0, EFD_CLOEXEC)), "fake-sg-2").value();
}

// Markers from kHung on block until released: the commands of the hung path.
constexpr std::uint32_t kHung = 100;
std::optional<FakeReply> block_hung(const FakeRequest& request) {
  if (marker_of(request) >= kHung) {
    return std::nullopt;
  }
  return good_reply(marker_of(request));
}

// Ends a test with hung commands: the transport goes (its queue with it), then the stuck calls
// return, so that count calls in all have returned.
void end_hung(Pool& pool, std::size_t count) {
  pool.transport.reset();
  for (const std::int32_t pack_id : pool.fake->blocked()) {
    pool.fake->release(pack_id, FakeReply{});
  }
  EXPECT_TRUE(pool.fake->wait_returned(count));
}

// One path's SG_IO never returns: its commands take at most per_path_max workers, and the other
// path's commands, queued behind them, still run on the workers left.
TEST(SgioPool, AHungPathHoldsAtMostItsWorkersWhileAnotherPathCompletes) {
  Pool pool = make_pool(3, block_hung, 2);
  const PathId other = add_path(pool);
  for (std::uint32_t i = 0; i < 4; ++i) {
    submit(*pool.transport, pool.path, marked_command(kHung + i, kHung + i, kLong));
  }
  ASSERT_TRUE(pool.fake->wait_blocked(2));
  for (std::uint32_t marker = 0; marker < 6; ++marker) {
    submit(*pool.transport, other, marked_command(marker, marker, kLong));
  }
  const auto done = by_tag(reap_count(*pool.transport, 6));
  ASSERT_EQ(done.size(), 6U) << "the other path's commands waited behind the hung one";
  for (const auto& [tag, completion] : done) {
    EXPECT_LT(tag, kHung);
    EXPECT_EQ(completion.outcome, Outcome::kGood);
  }
  EXPECT_EQ(pool.fake->blocked().size(), 2U) << "the hung path took more than its workers";
  end_hung(pool, 8);
}

// The only worker is stuck in SG_IO on a hung path: at its command's deadline the command is
// kIndeterminate and a new worker runs the other path's command, long before that one's deadline.
TEST(SgioPool, AWorkerStuckPastItsDeadlineIsReplaced) {
  Pool pool = make_pool(1, block_hung, 1);
  const PathId other = add_path(pool);
  submit(*pool.transport, pool.path, marked_command(kHung, 1, kShort));
  ASSERT_TRUE(pool.fake->wait_blocked(1));
  // Its deadline comes before the fake gives up on the stuck call (kFakeWaitMax): a command that
  // waited for the stuck worker ends unsent.
  constexpr milliseconds kMedium{2'000};
  submit(*pool.transport, other, marked_command(5, 2, kMedium));
  auto done = by_tag(reap_count(*pool.transport, 2));
  ASSERT_EQ(done.size(), 2U);
  EXPECT_EQ(done[1].outcome, Outcome::kIndeterminate);
  EXPECT_EQ(done[2].outcome, Outcome::kGood) << "waited for the stuck worker";
  EXPECT_EQ(pool.transport->zombie_count(), 1U);
  // The hung path takes no new worker while its stuck one holds its only place.
  submit(*pool.transport, pool.path, marked_command(kHung + 1, 3, kShort));
  submit(*pool.transport, other, marked_command(6, 4, kMedium));
  done = by_tag(reap_count(*pool.transport, 2));
  ASSERT_EQ(done.size(), 2U);
  EXPECT_EQ(done[3].outcome, Outcome::kOsError);
  EXPECT_EQ(done[3].os_errno, ETIMEDOUT);
  EXPECT_EQ(done[4].outcome, Outcome::kGood);
  EXPECT_EQ(pool.fake->received().size(), 3U) << "the second hung command was sent";
  end_hung(pool, 3);
}

TEST(SgioPool, RefusesBadThreadCountsAndDevices) {
  detail::SgioOptions options;
  options.threads = 0;
  EXPECT_EQ(detail::make_sgio_transport(options).error().code(), ErrorCode::kInvalidArgument);
  options.threads = 17;
  EXPECT_EQ(detail::make_sgio_transport(options).error().code(), ErrorCode::kInvalidArgument);
  options.threads = 4;
  options.per_path_max = 0;
  EXPECT_EQ(detail::make_sgio_transport(options).error().code(), ErrorCode::kInvalidArgument);
  options.per_path_max = 17;
  EXPECT_EQ(detail::make_sgio_transport(options).error().code(), ErrorCode::kInvalidArgument);

  auto transport = make_sgio_transport(1);
  ASSERT_TRUE(transport.has_value());
  const auto null_device = (*transport)->open_path("/dev/null");
  ASSERT_FALSE(null_device.has_value());
  EXPECT_EQ(null_device.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(null_device.error().message().find("/dev/null"), std::string::npos);
  const auto missing = (*transport)->open_path("/dev/blkfence-no-such-sd");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().errno_value(), ENOENT);
  EXPECT_NE(missing.error().message().find("/dev/blkfence-no-such-sd"), std::string::npos);
}

}  // namespace
}  // namespace blkfence::transport::test

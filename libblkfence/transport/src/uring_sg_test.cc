// Proves the io_uring sg transport against a fake sg device (fake_sg.h) on a real ring: answers,
// sense and data come back to the right tags; 40 commands on one path all complete with never more
// than 16 at the device; answers out of order are matched by pack_id; a command the device never
// answers becomes kIndeterminate at its deadline while the others complete, and its late answer is
// swallowed (no second completion; its buffers were still alive when the device wrote them, which
// the asan preset checks); a command stuck behind 16 unanswered ones is never sent; close_path()
// reports what the device holds as kIndeterminate and keeps the fd open until the device gives it
// back; poll_fd() wakes for answers and for deadlines; bad paths and commands are refused.
// Skips when this kernel refuses io_uring, unless BLKFENCE_REQUIRE_URING=1 (CI) makes that a
// failure.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string_view>
#include <thread>

#include <gtest/gtest.h>
#include <poll.h>

#include "blkfence/testing/fake_sg.h"

#include "transport_impl.h"

namespace blkfence::transport::test {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kLong{10'000};
constexpr milliseconds kShort{100};
constexpr milliseconds kGrace{20};

// Data the fake returns for a marker, so a completion proves which command it answers.
std::vector<std::uint8_t> data_for(std::uint32_t marker) {
  return {static_cast<std::uint8_t>(marker), static_cast<std::uint8_t>(marker >> 8U), 0xd0, 0x0d};
}

FakeReply good_reply(std::uint32_t marker) {
  FakeReply reply;
  reply.data_in = data_for(marker);
  return reply;
}

std::map<std::uint64_t, Completion> by_tag(std::vector<Completion> completions) {
  std::map<std::uint64_t, Completion> map;
  for (Completion& completion : completions) {
    const std::uint64_t tag = completion.tag;
    EXPECT_TRUE(map.emplace(tag, std::move(completion)).second) << "tag " << tag << " came twice";
  }
  return map;
}

bool uring_required() {
  const char* required = std::getenv("BLKFENCE_REQUIRE_URING");
  return required != nullptr && std::string_view(required) == "1";
}

class UringSgTest : public ::testing::Test {
 protected:
  void SetUp() override {
    detail::UringOptions options;
    options.deadline_grace = kGrace;
    auto made = detail::make_uring_transport(options);
    // A kernel or sandbox without io_uring (ENOSYS, EPERM) skips these tests, except where the
    // caller requires io_uring (BLKFENCE_REQUIRE_URING=1, set by .ci/run): there a skip would hide
    // that the product's main transport went untested.
    if (!made && made.error().code() == ErrorCode::kNotSupported && !uring_required()) {
      GTEST_SKIP() << made.error().message();
    }
    ASSERT_TRUE(made.has_value()) << made.error().message();
    transport_ = std::move(*made);
  }

  PathId attach(FakeSg& fake) {
    auto path = transport_->open_path_fd(fake.take_transport_end(), "fake-sg");
    EXPECT_TRUE(path.has_value());
    return path.value_or(0);
  }

  void submit(PathId path, Command command) {
    const auto submitted = transport_->submit(path, std::move(command));
    ASSERT_TRUE(submitted.has_value()) << submitted.error().message();
  }

  std::unique_ptr<detail::TransportImpl> transport_;
};

TEST_F(UringSgTest, AnswersCarryStatusSenseAndDataToTheirTags) {
  const std::vector<std::uint8_t> sense = {0x70, 0, 0x06, 0,    0,    0, 0, 0x0a, 0,
                                           0,    0, 0,    0x2a, 0x03, 0, 0, 0,    0};
  FakeSg fake([&sense](const FakeRequest& request) -> std::optional<FakeReply> {
    FakeReply reply;
    switch (marker_of(request)) {
      case 0: reply.data_in = {1, 2, 3, 4, 5, 6, 7, 8}; break;  // 8 of 16: resid 8
      case 1:
        reply.status = 0x02;
        reply.driver_status = 0x08;
        reply.sense = sense;
        break;
      case 2: reply.status = 0x18; break;
      case 3: reply.host_status = 0x03; break;  // DID_TIME_OUT
      default: reply.status = 0x08; break;
    }
    return reply;
  });
  const PathId path = attach(fake);
  for (std::uint32_t marker = 0; marker < 5; ++marker) {
    submit(path, marked_command(marker, 100 + marker, kLong));
  }
  auto done = by_tag(reap_count(*transport_, 5));
  ASSERT_EQ(done.size(), 5U);
  EXPECT_EQ(done[100].outcome, Outcome::kGood);
  EXPECT_EQ(done[100].data_in, (std::vector<std::uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_TRUE(done[100].sense.empty());
  EXPECT_EQ(done[101].outcome, Outcome::kCheckCondition);
  EXPECT_EQ(done[101].status, 0x02);
  EXPECT_EQ(done[101].driver_status, 0x08);
  EXPECT_EQ(done[101].sense, sense);
  EXPECT_EQ(done[102].outcome, Outcome::kReservationConflict);
  EXPECT_EQ(done[102].status, 0x18);
  EXPECT_EQ(done[103].outcome, Outcome::kIndeterminate);
  EXPECT_EQ(done[103].host_status, 0x03);
  EXPECT_EQ(done[104].outcome, Outcome::kBusy);
  for (const auto& [tag, completion] : done) {
    EXPECT_GT(completion.latency.count(), 0) << tag;
  }
  EXPECT_EQ(transport_->in_flight(), 0U);

  // What the device received: the CDB as built, sg's timeout in milliseconds, the sense room.
  const auto received = fake.received();
  ASSERT_EQ(received.size(), 5U);
  EXPECT_EQ(received[0].cdb.size(), 10U);
  EXPECT_EQ(received[0].cdb[0], 0x5e);
  EXPECT_EQ(received[0].timeout_ms, 10'000U);
  EXPECT_EQ(received[0].dxfer_len, 16U);
  EXPECT_EQ(received[0].mx_sb_len, detail::kSenseSizeMax);
}

TEST_F(UringSgTest, DataOutReachesTheDevice) {
  FakeSg fake([](const FakeRequest&) { return std::optional<FakeReply>(FakeReply{}); });
  const PathId path = attach(fake);
  Command prout =
      Command::from_cdb(std::vector<std::uint8_t>{0x5f, 0x06, 0x05, 0, 0, 0, 0, 0, 24, 0});
  prout.direction = DataDirection::kToDevice;
  for (std::uint8_t i = 0; i < 24; ++i) {
    prout.data_out.push_back(i);
  }
  const std::vector<std::uint8_t> sent = prout.data_out;
  prout.tag = 9;
  submit(path, std::move(prout));
  const auto done = reap_count(*transport_, 1);
  ASSERT_EQ(done.size(), 1U);
  EXPECT_EQ(done[0].tag, 9U);
  EXPECT_EQ(done[0].outcome, Outcome::kGood);
  EXPECT_TRUE(done[0].data_in.empty());
  ASSERT_EQ(fake.received().size(), 1U);
  EXPECT_EQ(fake.received()[0].dxfer_direction, SG_DXFER_TO_DEV);
  EXPECT_EQ(fake.received()[0].data_out, sent);
}

TEST_F(UringSgTest, FortyCommandsOnOnePathNeverMoreThanSixteenAtTheDevice) {
  FakeSg fake([](const FakeRequest&) { return std::optional<FakeReply>(); });  // holds all
  const PathId path = attach(fake);
  constexpr std::uint32_t kCommands = 40;
  for (std::uint32_t marker = 0; marker < kCommands; ++marker) {
    submit(path, marked_command(marker, marker, kLong));
  }
  std::vector<Completion> completions;
  while (completions.size() < kCommands) {
    const std::size_t expect_held = std::min<std::size_t>(16, kCommands - completions.size());
    ASSERT_TRUE(fake.wait_held(expect_held)) << completions.size() << " done";
    // Answer everything the device holds, newest first: sg returns whichever finishes first.
    std::vector<std::int32_t> held = fake.held();
    std::reverse(held.begin(), held.end());
    std::map<std::int32_t, std::uint32_t> marker_of_pack;
    for (const FakeRequest& request : fake.received()) {
      marker_of_pack[request.pack_id] = marker_of(request);
    }
    for (const std::int32_t pack_id : held) {
      // The status varies too: it travels in the header sg hands back, not in the slot's buffers,
      // so an answer matched to the wrong slot shows in its outcome.
      FakeReply reply = good_reply(marker_of_pack[pack_id]);
      reply.status = marker_of_pack[pack_id] % 2 == 0 ? 0x00 : 0x18;
      ASSERT_TRUE(fake.answer(pack_id, reply));
    }
    const auto reaped = reap_count(*transport_, held.size());
    ASSERT_EQ(reaped.size(), held.size());
    completions.insert(completions.end(), reaped.begin(), reaped.end());
  }
  EXPECT_EQ(fake.outstanding_max(), 16U);
  const auto done = by_tag(completions);
  ASSERT_EQ(done.size(), kCommands);
  for (const auto& [tag, completion] : done) {
    EXPECT_EQ(completion.outcome, tag % 2 == 0 ? Outcome::kGood : Outcome::kReservationConflict)
        << tag;
    EXPECT_EQ(completion.data_in, data_for(static_cast<std::uint32_t>(tag))) << tag;
  }
  EXPECT_EQ(fake.received().size(), kCommands);
  EXPECT_EQ(transport_->in_flight(), 0U);
}

// Commands submitted while corked (a batch: one io_uring_enter for all, at uncork) all reach the
// device once the outer cork goes, before anything is reaped, and complete with their own answers.
TEST_F(UringSgTest, CorkedSubmissionsReachTheDeviceAtUncork) {
  FakeSg fake(
      [](const FakeRequest& request) { return std::optional(good_reply(marker_of(request))); });
  const PathId path = attach(fake);
  constexpr std::uint32_t kCommands = 8;
  {
    const Corked outer(*transport_);
    for (std::uint32_t marker = 0; marker < kCommands / 2; ++marker) {
      submit(path, marked_command(marker, marker, kLong));
    }
    const Corked inner(*transport_);
    for (std::uint32_t marker = kCommands / 2; marker < kCommands; ++marker) {
      submit(path, marked_command(marker, marker, kLong));
    }
  }
  // Before any reap() (which would submit pending SQEs itself): uncork alone sent them.
  ASSERT_TRUE(fake.wait_received(kCommands));
  const auto done = by_tag(reap_count(*transport_, kCommands));
  ASSERT_EQ(done.size(), kCommands);
  for (const auto& [tag, completion] : done) {
    EXPECT_EQ(completion.outcome, Outcome::kGood) << tag;
    EXPECT_EQ(completion.data_in, data_for(static_cast<std::uint32_t>(tag))) << tag;
  }
  EXPECT_EQ(transport_->in_flight(), 0U);
}

TEST_F(UringSgTest, AnswersOutOfOrderAreMatchedByPackId) {
  FakeSg fake([](const FakeRequest&) { return std::optional<FakeReply>(); });
  const PathId path = attach(fake);
  for (std::uint32_t marker = 0; marker < 5; ++marker) {
    submit(path, marked_command(marker, 1000 + marker, kLong));
  }
  ASSERT_TRUE(fake.wait_held(5));
  const auto received = fake.received();
  for (const std::size_t i : std::initializer_list<std::size_t>{3, 0, 4, 1, 2}) {
    ASSERT_TRUE(fake.answer(received[i].pack_id, good_reply(marker_of(received[i]))));
    const auto done = reap_count(*transport_, 1);
    ASSERT_EQ(done.size(), 1U);
    EXPECT_EQ(done[0].tag, 1000 + marker_of(received[i]));
    EXPECT_EQ(done[0].data_in, data_for(marker_of(received[i])));
  }
}

TEST_F(UringSgTest, UnansweredCommandIsIndeterminateAndItsLateAnswerIsSwallowed) {
  // Marker 0 is never answered by the script; the others are answered at once.
  FakeSg fake([](const FakeRequest& request) -> std::optional<FakeReply> {
    if (marker_of(request) == 0) {
      return std::nullopt;
    }
    return good_reply(marker_of(request));
  });
  const PathId path = attach(fake);
  submit(path, marked_command(0, 1, kShort, 64));
  submit(path, marked_command(1, 2, kLong));
  submit(path, marked_command(2, 3, kLong));
  auto done = by_tag(reap_count(*transport_, 3));
  ASSERT_EQ(done.size(), 3U);
  EXPECT_EQ(done[1].outcome, Outcome::kIndeterminate);
  EXPECT_GE(done[1].latency, kShort);
  EXPECT_TRUE(done[1].data_in.empty());
  EXPECT_EQ(done[2].outcome, Outcome::kGood);
  EXPECT_EQ(done[3].outcome, Outcome::kGood);
  EXPECT_EQ(transport_->in_flight(), 0U);
  EXPECT_EQ(transport_->zombie_count(), 1U);
  // What the protocol waits on (Transport::unreturned): the kernel still holds the timed-out one.
  EXPECT_EQ(static_cast<const Transport&>(*transport_).unreturned(), std::optional<std::size_t>(1));

  // The late answer writes sense and 64 bytes of data through the zombie's pointers.
  FakeReply late;
  late.status = 0x02;
  late.sense.assign(18, 0x70);
  late.data_in.assign(64, 0xee);
  ASSERT_TRUE(fake.answer(fake.held().at(0), late));
  std::vector<Completion> extra;
  const auto give_up = std::chrono::steady_clock::now() + kFakeWaitMax;
  while (transport_->zombie_count() > 0 && std::chrono::steady_clock::now() < give_up) {
    ASSERT_TRUE(transport_->reap(milliseconds(50), extra).has_value());
  }
  EXPECT_EQ(transport_->zombie_count(), 0U);
  EXPECT_EQ(static_cast<const Transport&>(*transport_).unreturned(), std::optional<std::size_t>(0));
  EXPECT_TRUE(extra.empty()) << "the late answer completed tag " << extra.at(0).tag << " again";

  // The path still works afterwards.
  submit(path, marked_command(3, 4, kLong));
  const auto after = reap_count(*transport_, 1);
  ASSERT_EQ(after.size(), 1U);
  EXPECT_EQ(after[0].tag, 4U);
  EXPECT_EQ(after[0].data_in, data_for(3));
}

TEST_F(UringSgTest, CommandStuckBehindSixteenIsNeverSent) {
  constexpr std::uint32_t kStuck = 99;
  constexpr std::uint32_t kSentinel = 100;
  FakeSg fake([](const FakeRequest& request) -> std::optional<FakeReply> {
    if (marker_of(request) == kSentinel) {
      return good_reply(kSentinel);
    }
    return std::nullopt;
  });
  const PathId path = attach(fake);
  for (std::uint32_t marker = 0; marker < 16; ++marker) {
    submit(path, marked_command(marker, marker, kLong));
  }
  submit(path, marked_command(kStuck, kStuck, kShort));
  const auto expired = reap_count(*transport_, 1);
  ASSERT_EQ(expired.size(), 1U);
  EXPECT_EQ(expired[0].tag, kStuck);
  EXPECT_EQ(expired[0].outcome, Outcome::kOsError);
  EXPECT_EQ(expired[0].os_errno, ETIMEDOUT);

  ASSERT_TRUE(fake.wait_held(16));
  for (const std::int32_t pack_id : fake.held()) {
    ASSERT_TRUE(fake.answer(pack_id, FakeReply{}));
  }
  EXPECT_EQ(reap_count(*transport_, 16).size(), 16U);
  // The sentinel's answer comes after the device has read everything written before it.
  submit(path, marked_command(kSentinel, kSentinel, kLong));
  const auto sentinel = reap_count(*transport_, 1);
  ASSERT_EQ(sentinel.size(), 1U);
  EXPECT_EQ(sentinel[0].tag, kSentinel);
  const auto received = fake.received();
  EXPECT_EQ(received.size(), 17U);
  EXPECT_TRUE(std::none_of(received.begin(), received.end(),
                           [](const FakeRequest& r) { return marker_of(r) == kStuck; }));
}

TEST_F(UringSgTest, ClosePathReportsWhatTheDeviceHoldsAndKeepsTheFdUntilItIsBack) {
  FakeSg fake([](const FakeRequest&) { return std::optional<FakeReply>(); });
  const PathId path = attach(fake);
  for (std::uint32_t marker = 0; marker < 18; ++marker) {  // 16 at the device, 2 queued
    submit(path, marked_command(marker, marker, kLong));
  }
  ASSERT_TRUE(fake.wait_held(16));
  transport_->close_path(path);
  std::vector<Completion> closed;
  ASSERT_TRUE(transport_->reap(milliseconds(0), closed).has_value());
  auto done = by_tag(closed);
  ASSERT_EQ(done.size(), 18U);
  std::size_t indeterminate = 0;
  std::size_t cancelled = 0;
  for (const auto& [tag, completion] : done) {
    if (completion.outcome == Outcome::kIndeterminate) {
      ++indeterminate;
    } else if (completion.outcome == Outcome::kOsError && completion.os_errno == ECANCELED) {
      ++cancelled;
      EXPECT_GE(tag, 16U) << "a command the device held was reported as never sent";
    }
  }
  EXPECT_EQ(indeterminate, 16U);
  EXPECT_EQ(cancelled, 2U);
  EXPECT_EQ(transport_->in_flight(), 0U);
  EXPECT_EQ(transport_->zombie_count(), 16U);
  EXPECT_EQ(transport_->submit(path, marked_command(50, 50, kLong)).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(fake.peer_closed()) << "the fd was closed while the device held commands";

  // The device answers late; the transport reads every answer, reports none, then closes the fd.
  for (const std::int32_t pack_id : fake.held()) {
    ASSERT_TRUE(fake.answer(pack_id, good_reply(1)));
  }
  std::vector<Completion> extra;
  const auto give_up = std::chrono::steady_clock::now() + kFakeWaitMax;
  while (!fake.peer_closed() && std::chrono::steady_clock::now() < give_up) {
    ASSERT_TRUE(transport_->reap(milliseconds(50), extra).has_value());
  }
  EXPECT_TRUE(fake.peer_closed());
  EXPECT_TRUE(extra.empty());
  EXPECT_EQ(transport_->zombie_count(), 0U);
  EXPECT_EQ(fake.received().size(), 16U) << "a cancelled command was sent after all";
}

TEST_F(UringSgTest, ClosePathWithNothingInFlightClosesTheFdAtOnce) {
  FakeSg fake(
      [](const FakeRequest& r) { return std::optional<FakeReply>(good_reply(marker_of(r))); });
  const PathId path = attach(fake);
  submit(path, marked_command(1, 1, kLong));
  ASSERT_EQ(reap_count(*transport_, 1).size(), 1U);
  transport_->close_path(path);
  std::vector<Completion> none;
  const auto give_up = std::chrono::steady_clock::now() + kFakeWaitMax;
  while (!fake.peer_closed() && std::chrono::steady_clock::now() < give_up) {
    ASSERT_TRUE(transport_->reap(milliseconds(50), none).has_value());
  }
  EXPECT_TRUE(fake.peer_closed());
  EXPECT_TRUE(none.empty());
}

TEST_F(UringSgTest, PollFdWakesForAnswersAndForDeadlines) {
  FakeSg fake([](const FakeRequest& request) -> std::optional<FakeReply> {
    if (marker_of(request) == 0) {
      return std::nullopt;
    }
    return good_reply(marker_of(request));
  });
  const PathId path = attach(fake);
  pollfd watch{.fd = transport_->poll_fd(), .events = POLLIN, .revents = 0};
  const int wait_max_ms = static_cast<int>(milliseconds(kFakeWaitMax).count());

  // An answer: poll_fd() becomes readable until reap() returns it.
  submit(path, marked_command(1, 1, kLong));
  std::vector<Completion> got;
  while (got.empty()) {
    ASSERT_EQ(::poll(&watch, 1, wait_max_ms), 1) << "no wake-up for an answer";
    ASSERT_TRUE(transport_->reap(milliseconds(0), got).has_value());
  }
  EXPECT_EQ(got.at(0).tag, 1U);
  // reap() reads answers on every wake-up, so it may have read this one before the POLL_ADD that
  // waited for it posted its CQE; that CQE then wakes the fd once more. Reaping it must yield
  // nothing, and leave the fd quiet.
  if (::poll(&watch, 1, 0) == 1) {
    std::vector<Completion> none;
    ASSERT_TRUE(transport_->reap(milliseconds(0), none).has_value());
    EXPECT_TRUE(none.empty()) << "a completion reported twice";
  }
  EXPECT_EQ(::poll(&watch, 1, 0), 0) << "readable with nothing to reap";

  // A deadline: nobody answers, yet poll_fd() becomes readable when it passes.
  submit(path, marked_command(0, 2, kShort));
  got.clear();
  ASSERT_TRUE(transport_->reap(milliseconds(0), got).has_value());  // consumes the WRITE's CQE
  ASSERT_TRUE(got.empty());
  const auto before = std::chrono::steady_clock::now();
  while (got.empty()) {
    ASSERT_EQ(::poll(&watch, 1, wait_max_ms), 1) << "no wake-up for a deadline";
    ASSERT_TRUE(transport_->reap(milliseconds(0), got).has_value());
  }
  EXPECT_GE(std::chrono::steady_clock::now() - before, kShort - milliseconds(5));
  EXPECT_EQ(got.at(0).tag, 2U);
  EXPECT_EQ(got.at(0).outcome, Outcome::kIndeterminate);
}

TEST_F(UringSgTest, DestroyingWithCommandsInFlightClosesEverything) {
  FakeSg fake([](const FakeRequest&) { return std::optional<FakeReply>(); });
  const PathId path = attach(fake);
  for (std::uint32_t marker = 0; marker < 20; ++marker) {
    submit(path, marked_command(marker, marker, marker == 0 ? kShort : kLong));
  }
  ASSERT_TRUE(fake.wait_held(16));
  ASSERT_EQ(reap_count(*transport_, 1).size(), 1U);  // marker 0 is now a zombie
  ASSERT_EQ(transport_->zombie_count(), 1U);
  transport_.reset();
  EXPECT_TRUE(fake.wait_peer_closed());
}

TEST_F(UringSgTest, OpenPathRefusesWhatIsNotAnSgDevice) {
  const auto null_device = transport_->open_path("/dev/null");
  ASSERT_FALSE(null_device.has_value());
  EXPECT_EQ(null_device.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(null_device.error().message().find("/dev/null"), std::string::npos);
  EXPECT_NE(null_device.error().message().find("major 21"), std::string::npos);

  const auto missing = transport_->open_path("/dev/blkfence-no-such-sg");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), ErrorCode::kOs);
  EXPECT_EQ(missing.error().errno_value(), ENOENT);
  EXPECT_NE(missing.error().message().find("/dev/blkfence-no-such-sg"), std::string::npos);
}

TEST_F(UringSgTest, SubmitRefusesUnknownPathsAndMalformedCommands) {
  FakeSg fake([](const FakeRequest&) { return std::optional<FakeReply>(FakeReply{}); });
  const PathId path = attach(fake);
  EXPECT_EQ(transport_->submit(path + 100, marked_command(1, 1, kLong)).error().code(),
            ErrorCode::kInvalidArgument);
  Command bad = marked_command(1, 1, kLong);
  bad.cdb_size = 4;
  EXPECT_EQ(transport_->submit(path, bad).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(transport_->submit(path, marked_command(1, 1, milliseconds(0))).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(transport_->in_flight(), 0U);
  EXPECT_TRUE(fake.received().empty());
}

}  // namespace
}  // namespace blkfence::transport::test

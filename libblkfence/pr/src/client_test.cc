// Proves the PR client's policy against the simulated SPC-4 target: registrations reach every path
// of a LU; a command that meets a unit attention is retried and takes effect, and the attempt is
// recorded, unless the request asked to stop when the registrations changed; every attempt's tag
// names its request; RESERVATION CONFLICT is never retried; a lost answer is indeterminate, never
// "failed", and not retried; reads fail over to the next path on a transport error or a timeout
// while PR OUT does not; a read starts on the path that last answered, a path whose read timed out
// goes last until it answers again; an fd whose device was removed (ENODEV) is closed and its name
// opened again on the next request; one batch covers many LUs.
#include "blkfence/pr/client.h"

#include <map>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "blkfence/codec/prout.h"
#include "blkfence/testing/sim_clock.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/testing/sim_transport.h"

namespace blkfence::pr {
namespace {

using transport::Fault;
using transport::FaultContext;
using transport::Outcome;
using transport::SimTransport;

constexpr std::uint64_t kKeyA = 0x6c9d000100000001;
constexpr std::uint64_t kKeyB = 0x6c9d000200000002;
constexpr auto kWeRo = codec::PrType::kWriteExclusiveRegistrantsOnly;

// Two LUs; node A reaches each through two nexuses (multipath), node B through one.
class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (transport::LuId lu = 0; lu < 2; ++lu) {
      lus_[lu] = target_.add_lu();
      const std::string n = std::to_string(lu);
      target_.add_path("/dev/sg-a" + n + "-1", lus_[lu], kNexusA1);
      target_.add_path("/dev/sg-a" + n + "-2", lus_[lu], kNexusA2);
      target_.add_path("/dev/sg-b" + n, lus_[lu], kNexusB);
      a_.push_back(LogicalUnit{
          .wwn = "lu" + n,
          .name = "a" + n,
          .paths = {Path{.sg = "/dev/sg-a" + n + "-1", .sd = {}, .hctl = "1", .initiator = {}},
                    Path{.sg = "/dev/sg-a" + n + "-2", .sd = {}, .hctl = "2", .initiator = {}}}});
      b_.push_back(LogicalUnit{
          .wwn = "lu" + n,
          .name = "b" + n,
          .paths = {Path{.sg = "/dev/sg-b" + n, .sd = {}, .hctl = "3", .initiator = {}}}});
    }
    use_faults({});
  }

  void use_faults(transport::FaultHook hook) {
    client_.reset();
    auto made = SimTransport::make(target_, {.seed = 7,
                                             .latency_min = std::chrono::microseconds(100),
                                             .latency_max = std::chrono::microseconds(500),
                                             .deadline_grace = std::chrono::milliseconds(0),
                                             .fault = std::move(hook)});
    ASSERT_TRUE(made.has_value());
    transport_ = std::move(*made);
    RetryPolicy policy;
    policy.command_timeout = std::chrono::milliseconds(200);
    client_ = std::make_unique<Client>(*transport_, policy);
  }

  std::vector<std::uint64_t> keys_on(transport::LuId lu) const {
    std::vector<std::uint64_t> keys;
    for (const auto& r : target_.registrations(lus_[lu])) {
      keys.push_back(r.key);
    }
    return keys;
  }

  static constexpr transport::NexusId kNexusA1 = 1;
  static constexpr transport::NexusId kNexusA2 = 2;
  static constexpr transport::NexusId kNexusB = 3;
  transport::SimClock clock_;
  transport::SimTarget target_{clock_};
  transport::LuId lus_[2]{};
  std::vector<LogicalUnit> a_, b_;
  std::unique_ptr<SimTransport> transport_;
  std::unique_ptr<Client> client_;
};

TEST_F(ClientTest, RegistersOnEveryPathOfEveryLuInOneBatch) {
  const auto results = client_->register_and_ignore(a_, kKeyA);
  ASSERT_EQ(results.size(), 2U);
  for (transport::LuId lu = 0; lu < 2; ++lu) {
    ASSERT_TRUE(results[lu].value.has_value()) << results[lu].value.error().message();
    EXPECT_EQ(results[lu].attempts.size(), 2U);
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{kKeyA, kKeyA}));
  }
  const auto keys = client_->read_keys(b_);
  ASSERT_TRUE(keys[1].value.has_value());
  EXPECT_EQ(keys[1].value->keys, (std::vector<std::uint64_t>{kKeyA, kKeyA}));
}

TEST_F(ClientTest, UnitAttentionIsRetriedAndTheCommandTakesEffect) {
  ASSERT_TRUE(client_->register_and_ignore(a_, kKeyA)[0].value);
  ASSERT_TRUE(client_->reserve(a_, kKeyA, kWeRo)[0].value);
  ASSERT_TRUE(client_->register_and_ignore(b_, kKeyB)[0].value);
  // B preempts A: A's nexuses now hold 2A/05 (registrations preempted).
  ASSERT_TRUE(client_->preempt(b_, kKeyB, kKeyA, kWeRo, false)[0].value);
  ASSERT_FALSE(target_.unit_attentions(lus_[0], kNexusA1).empty());

  const auto results = client_->register_and_ignore({a_[0]}, kKeyA + 1);
  ASSERT_TRUE(results[0].value.has_value()) << results[0].value.error().message();
  int unit_attentions = 0;
  for (const auto& attempt : results[0].attempts) {
    if (attempt.outcome == Outcome::kCheckCondition) {
      ASSERT_TRUE(attempt.sense.has_value());
      EXPECT_EQ(attempt.sense->sense_key, codec::SenseKey::kUnitAttention);
      ++unit_attentions;
    }
  }
  EXPECT_EQ(unit_attentions, 2) << "one per nexus of A, each retried";
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{kKeyB, kKeyA + 1, kKeyA + 1}));
}

// The tags of the commands name their request: a resend after the unit attention keeps its
// request's, and the two paths' registrations (two requests of one batch) have their own.
TEST_F(ClientTest, EveryAttemptOfARequestCarriesItsRequestInTheTag) {
  std::vector<std::pair<transport::NexusId, std::uint64_t>> sent;  // nexus, tag
  use_faults([&sent](const FaultContext& c) {
    sent.emplace_back(c.nexus, c.command.tag);
    return Fault{};
  });
  ASSERT_TRUE(client_->register_and_ignore(a_, kKeyA)[0].value);
  ASSERT_TRUE(client_->reserve(a_, kKeyA, kWeRo)[0].value);
  ASSERT_TRUE(client_->register_and_ignore(b_, kKeyB)[0].value);
  ASSERT_TRUE(client_->preempt(b_, kKeyB, kKeyA, kWeRo, false)[0].value);  // A's nexuses: 2A/05
  const std::size_t before = sent.size();
  ASSERT_TRUE(client_->register_and_ignore({a_[0]}, kKeyA + 1)[0].value);

  std::map<transport::NexusId, std::vector<std::uint64_t>> tags;
  for (std::size_t i = before; i < sent.size(); ++i) {
    tags[sent[i].first].push_back(sent[i].second);
  }
  ASSERT_EQ(tags.size(), 2U);
  for (const auto& [nexus, of_nexus] : tags) {
    ASSERT_EQ(of_nexus.size(), 2U) << "nexus " << nexus << ": the unit attention, then the resend";
    EXPECT_NE(of_nexus[0], of_nexus[1]) << "each attempt has a tag of its own";
    EXPECT_EQ(request_of_tag(of_nexus[0]), request_of_tag(of_nexus[1]));
  }
  EXPECT_NE(request_of_tag(tags[kNexusA1][0]), request_of_tag(tags[kNexusA2][0]));
  for (std::size_t i = 0; i < before; ++i) {
    EXPECT_NE(request_of_tag(sent[i].second), request_of_tag(tags[kNexusA1][0]));
    EXPECT_NE(request_of_tag(sent[i].second), request_of_tag(tags[kNexusA2][0]));
  }
}

// A request that is right only in the state its caller read stops, instead of being resent, at a
// unit attention that says the registrations changed: sent again, REGISTER AND IGNORE EXISTING KEY
// would register a key whatever happened meanwhile.
TEST_F(ClientTest, ARequestThatStopsWhenPreemptedIsNotResentAfterRegistrationsChanged) {
  ASSERT_TRUE(client_->register_and_ignore(a_, kKeyA)[0].value);
  ASSERT_TRUE(client_->reserve(a_, kKeyA, kWeRo)[0].value);
  ASSERT_TRUE(client_->register_and_ignore(b_, kKeyB)[0].value);
  // B preempts A: A's nexuses now hold 2A/05 (registrations preempted).
  ASSERT_TRUE(client_->preempt(b_, kKeyB, kKeyA, kWeRo, false)[0].value);
  ASSERT_FALSE(target_.unit_attentions(lus_[0], kNexusA1).empty());

  auto requests =
      prout_every_path(LogicalUnit{.wwn = a_[0].wwn, .name = a_[0].name, .paths = {a_[0].paths[0]}},
                       codec::prout_register_and_ignore(kKeyA), "REGISTER (new path)");
  ASSERT_EQ(requests.size(), 1U);
  requests[0].stop_when_preempted = true;
  const auto responses = client_->run(std::move(requests));
  ASSERT_EQ(responses.size(), 1U);
  EXPECT_FALSE(responses[0].data.has_value()) << "stopped with an error";
  ASSERT_EQ(responses[0].attempts.size(), 1U) << "not resent";
  ASSERT_TRUE(responses[0].attempts[0].sense.has_value());
  EXPECT_EQ(responses[0].attempts[0].sense->asc, 0x2a);
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{kKeyB})) << "the preempted key stays off";
}

TEST_F(ClientTest, ReservationConflictIsNeverRetried) {
  ASSERT_TRUE(client_->register_and_ignore(a_, kKeyA)[0].value);
  ASSERT_TRUE(client_->register_and_ignore(b_, kKeyB)[0].value);
  ASSERT_TRUE(client_->reserve(a_, kKeyA, kWeRo)[0].value);
  const auto results = client_->reserve(b_, kKeyB, kWeRo);
  ASSERT_FALSE(results[0].value.has_value());
  EXPECT_EQ(results[0].value.error().code(), ErrorCode::kReservationConflict);
  EXPECT_EQ(results[0].attempts.size(), 1U);
  EXPECT_NE(results[0].value.error().message().find("RESERVE on /dev/sg-b0"), std::string::npos);
}

TEST_F(ClientTest, LostAnswerIsIndeterminateAndNotRetried) {
  use_faults([](const FaultContext&) {
    Fault fault;
    fault.drop_response = true;
    return fault;
  });
  const auto results = client_->register_and_ignore({b_[0]}, kKeyB);
  ASSERT_FALSE(results[0].value.has_value());
  EXPECT_EQ(results[0].value.error().code(), ErrorCode::kIndeterminate);
  EXPECT_EQ(results[0].attempts.size(), 1U);
  // The command executed although its answer was lost: exactly the case that must be re-read.
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{kKeyB}));
}

TEST_F(ClientTest, ReadsFailOverToTheNextPathButPrOutDoesNot) {
  ASSERT_TRUE(client_->register_and_ignore(a_, kKeyA)[0].value);
  // Every command through A's first nexus fails in the transport (DID_NO_CONNECT).
  use_faults([](const FaultContext& c) {
    Fault fault;
    fault.transport_error = c.nexus == kNexusA1;
    return fault;
  });
  const auto keys = client_->read_keys({a_[0]});
  ASSERT_TRUE(keys[0].value.has_value()) << keys[0].value.error().message();
  ASSERT_EQ(keys[0].attempts.size(), 2U);
  EXPECT_EQ(keys[0].attempts[0].outcome, Outcome::kTransportError);
  EXPECT_EQ(keys[0].attempts[1].device, "/dev/sg-a0-2");

  const auto reserve = client_->reserve({a_[0]}, kKeyA, kWeRo);
  ASSERT_FALSE(reserve[0].value.has_value());
  EXPECT_EQ(reserve[0].attempts.size(), 1U);
  EXPECT_FALSE(target_.reservation(lus_[0]).has_value());
}

// A path of a multipath LU that never answers (its commands vanish): a read gets its answer through
// the other path in the same request, and the next read goes to that path first.
TEST_F(ClientTest, AReadThatTimesOutFailsOverAndTheNextStartsOnThePathThatAnswered) {
  ASSERT_TRUE(client_->register_and_ignore(a_, kKeyA)[0].value);
  std::vector<transport::NexusId> sent;
  transport::NexusId hung = kNexusA1;  // its commands vanish
  transport::NexusId down = 0;         // its commands fail at once (DID_NO_CONNECT)
  use_faults([&](const FaultContext& c) {
    sent.push_back(c.nexus);
    Fault fault;
    fault.drop_request = c.nexus == hung;
    fault.transport_error = c.nexus == down;
    return fault;
  });

  const auto keys = client_->read_keys({a_[0]});
  ASSERT_TRUE(keys[0].value.has_value()) << keys[0].value.error().message();
  EXPECT_EQ(keys[0].value->keys, (std::vector<std::uint64_t>{kKeyA, kKeyA}));
  ASSERT_EQ(keys[0].attempts.size(), 2U);
  EXPECT_EQ(keys[0].attempts[0].device, "/dev/sg-a0-1");
  EXPECT_EQ(keys[0].attempts[0].outcome, Outcome::kIndeterminate);
  EXPECT_EQ(keys[0].attempts[1].device, "/dev/sg-a0-2");
  EXPECT_EQ(keys[0].attempts[1].outcome, Outcome::kGood);

  sent.clear();
  for (int round = 0; round < 3; ++round) {
    const auto again = client_->read_reservation({a_[0]});
    ASSERT_TRUE(again[0].value.has_value()) << again[0].value.error().message();
    ASSERT_EQ(again[0].attempts.size(), 1U) << "round " << round;
    EXPECT_EQ(again[0].attempts[0].device, "/dev/sg-a0-2");
  }
  EXPECT_EQ(sent, (std::vector<transport::NexusId>{kNexusA2, kNexusA2, kNexusA2}))
      << "the hung path is not tried first again";

  // The path that answers goes first; the one that timed out comes back only when it answers.
  hung = 0;
  down = kNexusA2;
  sent.clear();
  ASSERT_TRUE(client_->read_keys({a_[0]})[0].value);
  ASSERT_TRUE(client_->read_keys({a_[0]})[0].value);
  EXPECT_EQ(sent, (std::vector<transport::NexusId>{kNexusA2, kNexusA1, kNexusA1}));
}

// A device removed under an open fd (sg.c answers ENODEV from then on, and keeps the device, with
// its sg minor, until the fd is closed): the read fails over, the fd is closed at once, and a later
// request that names the device opens it again, reaching whatever the name names now.
TEST_F(ClientTest, AnFdWhoseDeviceWasRemovedIsClosedAndTheNameOpenedAgain) {
  bool removed = false;
  use_faults([&](const FaultContext& c) {
    Fault fault;
    fault.os_errno = removed && c.nexus == kNexusA1 ? ENODEV : 0;
    return fault;
  });
  ASSERT_TRUE(client_->read_keys({a_[0]})[0].value);
  ASSERT_EQ(transport_->open_paths(), 1U);

  removed = true;
  const auto keys = client_->read_keys({a_[0]});
  ASSERT_TRUE(keys[0].value.has_value()) << keys[0].value.error().message();
  ASSERT_EQ(keys[0].attempts.size(), 2U);
  EXPECT_EQ(keys[0].attempts[0].outcome, Outcome::kOsError);
  EXPECT_EQ(keys[0].attempts[1].device, "/dev/sg-a0-2");
  EXPECT_EQ(transport_->open_paths(), 1U) << "the removed device's fd is still open";
  EXPECT_EQ(transport_->opened_paths(), 2U);

  removed = false;  // a device under the same name again
  const LogicalUnit first_path_only{
      .wwn = a_[0].wwn, .name = a_[0].name, .paths = {a_[0].paths[0]}};
  const auto again = client_->read_keys({first_path_only});
  ASSERT_TRUE(again[0].value.has_value()) << again[0].value.error().message();
  EXPECT_EQ(transport_->opened_paths(), 3U) << "the name is opened again, not the dead fd reused";
  EXPECT_EQ(transport_->open_paths(), 2U);
}

// A LU's device went away and its name came back on another LU (the kernel reuses a freed sg
// minor). The engine opens the name again and checks what it reaches before sending anything: a PR
// OUT fails without reaching the other LU, the fd is not kept, a read fails over to the LU's next
// path; once the name reaches its LU again, it is used again.
TEST_F(ClientTest, ANameThatNowReachesAnotherLuIsCheckedAndNotUsed) {
  constexpr transport::NexusId kNexusOther = 9;
  bool removed = false;
  use_faults([&](const FaultContext& c) {
    Fault fault;
    fault.os_errno = removed && (c.nexus == kNexusA1 || c.nexus == kNexusOther) ? ENODEV : 0;
    return fault;
  });
  std::vector<std::string> checked;
  client_->check_identity_with([&](const transport::DeviceNumber& node, const std::string& device,
                                   const std::string& wwn) -> Result<void> {
    checked.push_back(device);
    const std::string reached = node.minor == lus_[0] ? "lu0" : "lu1";
    if (reached != wwn) {
      return tl::unexpected(Error::os(ENODEV, device + " is LU " + reached + " now"));
    }
    return {};
  });
  ASSERT_TRUE(client_->read_keys({a_[0]})[0].value);
  EXPECT_EQ(checked, std::vector<std::string>{"/dev/sg-a0-1"}) << "checked when first opened";

  removed = true;  // the device goes; the engine closes its fd at the ENODEV
  ASSERT_TRUE(client_->read_keys({a_[0]})[0].value);
  removed = false;
  target_.move_path("/dev/sg-a0-1", lus_[1], kNexusOther);

  const std::size_t open_before = transport_->open_paths();
  const auto registered = client_->register_and_ignore({a_[0]}, kKeyA);
  ASSERT_FALSE(registered[0].value.has_value());
  EXPECT_NE(registered[0].value.error().message().find("/dev/sg-a0-1 is LU lu1 now"),
            std::string::npos)
      << registered[0].value.error().message();
  EXPECT_EQ(registered[0].value.error().errno_value(), ENODEV);
  EXPECT_TRUE(keys_on(1).empty()) << "nothing reached the other LU";
  EXPECT_EQ(keys_on(0), std::vector<std::uint64_t>{kKeyA}) << "the LU's other path registered";
  EXPECT_EQ(transport_->open_paths(), open_before) << "the other LU's fd is not kept";

  const auto keys = client_->read_keys({a_[0]});
  ASSERT_TRUE(keys[0].value.has_value()) << keys[0].value.error().message();
  EXPECT_EQ(keys[0].attempts.back().device, "/dev/sg-a0-2");

  // The name is now a path of the other LU, opened for it; the first LU's list still names it.
  const LogicalUnit taken{.wwn = "lu1", .name = "a1", .paths = {a_[0].paths[0]}};
  ASSERT_TRUE(client_->read_keys({taken})[0].value);
  const std::size_t open_with_taken = transport_->open_paths();
  const LogicalUnit stale{.wwn = a_[0].wwn, .name = a_[0].name, .paths = {a_[0].paths[0]}};
  const auto lent = client_->register_and_ignore({stale}, kKeyA);
  ASSERT_FALSE(lent[0].value.has_value());
  EXPECT_EQ(lent[0].value.error().errno_value(), ESTALE) << lent[0].value.error().message();
  EXPECT_TRUE(keys_on(1).empty()) << "nothing of the first LU's reached the other LU";
  EXPECT_EQ(transport_->open_paths(), open_with_taken) << "the other LU's fd stays open";

  removed = true;  // the other LU's device goes too, and the name comes back to the first LU
  EXPECT_FALSE(client_->read_keys({taken})[0].value);
  removed = false;
  target_.move_path("/dev/sg-a0-1", lus_[0], kNexusA1);
  const LogicalUnit first_path_only{
      .wwn = a_[0].wwn, .name = a_[0].name, .paths = {a_[0].paths[0]}};
  const auto again = client_->read_keys({first_path_only});
  ASSERT_TRUE(again[0].value.has_value()) << again[0].value.error().message();
  EXPECT_EQ(std::count(checked.begin(), checked.end(), "/dev/sg-a0-1"), 4)
      << "checked at every open: the first; the other LU's, refused to the first LU and then "
         "opened for its own; the first LU's again";
}

// A PR OUT whose answer never comes may still execute where it was sent (S4): it is indeterminate
// and never sent again through another device, even one its request lists, and even when a read
// of the same LU failed over from that path just before.
TEST_F(ClientTest, APrOutThatTimesOutIsNotResentOnAnotherPath) {
  ASSERT_TRUE(client_->register_and_ignore(a_, kKeyA)[0].value);
  std::vector<transport::NexusId> sent;
  use_faults([&](const FaultContext& c) {
    sent.push_back(c.nexus);
    Fault fault;
    fault.drop_request = c.nexus == kNexusA1;
    return fault;
  });
  ASSERT_TRUE(client_->read_keys({a_[0]})[0].value);
  sent.clear();
  Request reserve = prout_first_path(a_[0], codec::prout_reserve(kKeyA, kWeRo), "RESERVE");
  reserve.devices = {"/dev/sg-a0-1", "/dev/sg-a0-2"};
  std::vector<Request> requests;
  requests.push_back(std::move(reserve));
  const auto responses = client_->run(std::move(requests));
  ASSERT_EQ(responses.size(), 1U);
  ASSERT_FALSE(responses[0].data.has_value());
  EXPECT_EQ(responses[0].data.error().code(), ErrorCode::kIndeterminate);
  ASSERT_EQ(responses[0].attempts.size(), 1U);
  EXPECT_EQ(responses[0].attempts[0].device, "/dev/sg-a0-1") << "sent where the caller said";
  EXPECT_EQ(sent, (std::vector<transport::NexusId>{kNexusA1}));
  EXPECT_FALSE(target_.reservation(lus_[0]).has_value());
}

TEST_F(ClientTest, PreemptAndAbortFencesEveryNexusOfTheVictim) {
  ASSERT_TRUE(client_->register_and_ignore(a_, kKeyA)[1].value);
  ASSERT_TRUE(client_->reserve(a_, kKeyA, kWeRo)[1].value);
  ASSERT_TRUE(client_->register_and_ignore(b_, kKeyB)[1].value);
  const auto results = client_->preempt(b_, kKeyB, kKeyA, kWeRo, true);
  for (transport::LuId lu = 0; lu < 2; ++lu) {
    ASSERT_TRUE(results[lu].value.has_value()) << results[lu].value.error().message();
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{kKeyB}));
    ASSERT_TRUE(target_.reservation(lus_[lu]).has_value());
    EXPECT_EQ(target_.reservation(lus_[lu])->key, kKeyB);
  }
  const auto reservation = client_->read_reservation(a_);
  ASSERT_TRUE(reservation[0].value.has_value());
  ASSERT_TRUE(reservation[0].value->reservation.has_value());
  EXPECT_EQ(reservation[0].value->reservation->key, kKeyB);
}

}  // namespace
}  // namespace blkfence::pr

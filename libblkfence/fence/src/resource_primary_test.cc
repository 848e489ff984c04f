// Proves fence::Resource's primary mode (docs/protocol.md, "Primary mode") on the bench of
// resource_test_bench.h: members register and never reserve; promote preempts the old primary's
// key only, draws a higher epoch, and keeps the promoting member registered throughout; a cancelled
// promote or acquire sends no PREEMPT; a failed promote leaves a member a member; a restarted
// primary is adopted as the primary, and its promote waits for a REGISTER of the run before that
// may still execute; the primary's release keeps the reservation, and a fenced primary rejoins with
// a new epoch; a member's promote leaves the host's queues of writes alone, a rejoin stops them.
#include <algorithm>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "resource_test_bench.h"

namespace blkfence::fence::test {
namespace {

constexpr auto kPreempt = static_cast<std::uint8_t>(codec::PrOutAction::kPreempt);
constexpr auto kRegisterAndIgnore =
    static_cast<std::uint8_t>(codec::PrOutAction::kRegisterAndIgnoreExistingKey);

// The node's disk, whose first load fails (slow at the daemon's start), and then answers.
class FirstLoadFails final : public EpochStore {
 public:
  explicit FirstLoadFails(EpochStore& inner) : inner_(inner) {}
  Result<std::optional<StoredEpochs>> load(const std::string& resource) override {
    if (!failed_) {
      failed_ = true;
      return fail(ErrorCode::kIndeterminate, "load " + resource + ": not done after 1000 ms");
    }
    return inner_.load(resource);
  }
  Result<void> store(const std::string& resource, StoredEpochs epochs) override {
    return inner_.store(resource, epochs);
  }
  std::string where(const std::string& resource) const override { return inner_.where(resource); }

 private:
  EpochStore& inner_;
  bool failed_ = false;
};

class PrimaryTest : public ResourceTest {
 protected:
  ResourceOptions primary(Node& node) const {
    ResourceOptions o = node.options(Mode::kShared);
    o.primary = true;
    o.type = kWeRo;
    return o;
  }
  void boot_members() { boot_members(primary(*a), primary(*b)); }
  void boot_members(ResourceOptions for_a, ResourceOptions for_b) {
    a->boot(std::move(for_a));
    b->boot(std::move(for_b));
    a->resource->start(now());
    b->resource->start(now());
    ASSERT_TRUE(
        run_until([&] { return a->resource->state_known() && b->resource->state_known(); }));
    for (Node* node : {a.get(), b.get()}) {
      Outcome* unfenced = node->unfence();
      ASSERT_TRUE(run_until([&] { return unfenced->done(); }));
      ASSERT_TRUE(unfenced->result->has_value()) << unfenced->result->error().message();
      members.push_back(**unfenced->result);
    }
  }
  Key promoted(Node& node) {
    Outcome* outcome = node.promote();
    EXPECT_TRUE(run_until([outcome] { return outcome->done(); }));
    EXPECT_TRUE(outcome->done() && outcome->result->has_value())
        << (outcome->done() ? outcome->result->error().message() : std::string("not done"));
    return outcome->done() && outcome->result->has_value() ? **outcome->result : key_of(1, 0);
  }
  // The keys boot_members registered, A's then B's: each a new epoch above every key seen.
  std::vector<Key> members;
  std::size_t prouts_by(std::uint16_t node, std::uint8_t action) const {
    const auto records = prouts_of(node);
    return static_cast<std::size_t>(
        std::count_if(records.begin(), records.end(),
                      [action](const auto& r) { return r.service_action == action; }));
  }
};

// Members register with epochs 1 and 2 and leave the LUs unreserved; A's promote reserves them
// with epoch 3; B's promote preempts A's key (A's registrations go, the reservation moves to B with
// epoch 4), and B was registered throughout. A's monitor sees the fence; B stays the primary, A a
// fenced node.
TEST_F(PrimaryTest, PromotePreemptsTheOldPrimaryAndKeepsTheMembers) {
  boot_members();
  ASSERT_EQ(members, (std::vector<Key>{key_of(kNodeA, 1), key_of(kNodeB, 2)}))
      << "a member's key is a new epoch, as a promote's is";
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), std::nullopt) << "members never reserve";
  }
  EXPECT_EQ(a->resource->state(), State::kUnfenced);
  EXPECT_TRUE(b->resource->gate_open());

  const Key first = promoted(*a);
  EXPECT_EQ(first, key_of(kNodeA, 3));
  EXPECT_EQ(a->resource->state(), State::kHeld);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), first.value());
    EXPECT_EQ(keys_on(lu),
              (std::vector<std::uint64_t>{first.value(), first.value(), members[1].value()}));
  }
  EXPECT_EQ(prouts_by(kNodeA, kPreempt), 0U) << "nobody held: RESERVE, no preempt";
  Outcome* again = a->unfence();
  ASSERT_TRUE(again->done()) << "the primary is a member already";
  EXPECT_EQ(**again->result, first);
  EXPECT_EQ(holder_of(0), first.value());

  (void)run_until([] { return false; }, 3 * kCheckInterval);
  EXPECT_TRUE(b->resource->gate_open()) << "the primary's monitor preempts no member";
  EXPECT_EQ(a->resource->state(), State::kHeld);

  const Key second = promoted(*b);
  EXPECT_EQ(second, key_of(kNodeB, 4)) << "above every key of the cluster on the LUs";
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), second.value());
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{second.value()}));
  }
  EXPECT_TRUE(b->resource->gate_open());
  EXPECT_EQ(b->resource->state(), State::kHeld);
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_EQ(a->resource->fenced_by(), second.value());
  ASSERT_TRUE(b->recorder.last(EventKind::kAcquired).has_value());
  EXPECT_EQ(b->recorder.last(EventKind::kAcquired)->second.other_key, first.value());

  // A fenced node is not re-registered by its own monitor (S5).
  (void)run_until([] { return false; }, 4 * kCheckInterval);
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{second.value()}));
}

// A's promote held every LU, then LU 1 lost its reservation (an operator's RELEASE through A's
// holding nexus) with A's key still registered there. B's promote must not remove that
// registration while LU 1 is unreserved: A's nexus would then write on a LU that refuses no
// write. It RESERVEs LU 1 first, removes A's key there once it holds, and preempts A's holding key
// on the other LUs last.
TEST_F(PrimaryTest, APromoteRemovesTheOldPrimarysKeyOnlyFromALuItReserved) {
  boot_members();
  const Key first = promoted(*a);
  prout_directly(nexus_of(kNodeA, 1, 0), LuId{1}, codec::prout_release(first.value(), kWeRo));
  ASSERT_FALSE(holder_of(1).has_value());
  const Key second = promoted(*b);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), second.value());
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{second.value()}));
  }
  for (const transport::PrOutRecord& record : prouts_of(kNodeB)) {
    EXPECT_TRUE(record.unregistered.empty() || record.reservation.has_value())
        << "LU " << record.lu << ": a registration removed, and the LU left unreserved";
  }
}

// fence is shared mode's: in primary mode a member's PREEMPT of the primary's key would take the
// reservation (and pass for a primary), and one of another member's key would leave its nexus
// unregistered on LUs nobody reserved yet, open to its writes. Refused, and nothing is sent.
TEST_F(PrimaryTest, FenceIsRefusedInPrimaryMode) {
  boot_members();
  const Key first = promoted(*a);
  const std::size_t before = sent.size();
  Outcome* fenced = b->fence_node(kNodeA);
  ASSERT_TRUE(fenced->done());
  ASSERT_FALSE(fenced->result->has_value());
  EXPECT_EQ(fenced->result->error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(fenced->result->error().message().find("a promote fences the old primary"),
            std::string::npos)
      << fenced->result->error().message();
  EXPECT_TRUE(b->sent_since(before).empty());
  EXPECT_EQ(holder_of(0), first.value());
  EXPECT_TRUE(b->resource->gate_open());
}

// docs/protocol.md, "Writes queued in the initiator": a member's promote leaves its host's queues
// alone (its gate is open and its key on every LU: what it queued goes out through a nexus that
// stays registered), while a fenced primary, its gate closed, stops them before it registers again.
TEST_F(PrimaryTest, APromotingMemberKeepsItsQueuesAndAFencedPrimaryStopsThemToRejoin) {
  std::vector<bool> a_told;
  std::vector<bool> b_told;
  const auto told_into = [](std::vector<bool>& told) {
    return [&told](const pr::LogicalUnit&, bool queue) -> Result<void> {
      told.push_back(queue);
      return {};
    };
  };
  ResourceOptions for_a = primary(*a);
  for_a.host_queueing = told_into(a_told);
  ResourceOptions for_b = primary(*b);
  for_b.host_queueing = told_into(b_told);
  ASSERT_NO_FATAL_FAILURE(boot_members(std::move(for_a), std::move(for_b)));
  a_told.clear();
  b_told.clear();
  (void)promoted(*a);
  const Key second = promoted(*b);
  EXPECT_EQ(std::count(a_told.begin(), a_told.end(), false), 0) << "A promoted as a member";
  EXPECT_EQ(std::count(b_told.begin(), b_told.end(), false), 0) << "B promoted as a member";

  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  EXPECT_EQ(a_told, std::vector<bool>(kLus, false)) << "stopped as A's gate closed";
  a_told.clear();
  Outcome* rejoined = a->unfence();
  ASSERT_TRUE(run_until([rejoined] { return rejoined->done(); }));
  ASSERT_TRUE(rejoined->result->has_value()) << rejoined->result->error().message();
  EXPECT_GT((**rejoined->result).epoch(), second.epoch()) << "a new epoch";
  ASSERT_GE(a_told.size(), 2 * kLus);
  EXPECT_EQ(std::vector<bool>(a_told.begin(), a_told.begin() + kLus),
            std::vector<bool>(kLus, false))
      << "stopped before A registers again";
  EXPECT_TRUE(a_told.back()) << "given back once A's gate opened";
}

// docs/protocol.md, "Writes queued in the initiator": a member whose gate closed on lost contact
// but whose key the promote's reads show on every LU was not fenced: its writes (a replica writing
// its own LU all along) go through nexuses that stay registered, and its promote does not wait for
// them. Once fenced, its rejoin waits for them before it registers.
TEST_F(PrimaryTest, AMemberThatLostContactButWasNotFencedPromotesWithoutWaitingForItsWrites) {
  ResourceOptions for_a = primary(*a);
  std::uint64_t a_writes = 0;
  for_a.writes_in_flight = [&a_writes](const pr::LogicalUnit&) -> Result<std::uint64_t> {
    return a_writes;
  };
  ASSERT_NO_FATAL_FAILURE(boot_members(std::move(for_a), primary(*b)));
  a_writes = 3;
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kNoAnswer);
  }
  ASSERT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kUp);
  }
  const Key first = promoted(*a);
  EXPECT_EQ(a->resource->state(), State::kHeld) << a->resource->detail();

  const Key second = promoted(*b);
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  Outcome* rejoined = a->unfence();
  ASSERT_TRUE(run_until([&] {
    return a->resource->detail().find("3 write(s) in flight") != std::string::npos;
  })) << a->resource->detail();
  EXPECT_FALSE(rejoined->done());
  a_writes = 0;
  ASSERT_TRUE(run_until([rejoined] { return rejoined->done(); }));
  ASSERT_TRUE(rejoined->result->has_value()) << rejoined->result->error().message();
  EXPECT_GT((**rejoined->result).epoch(), second.epoch());
  EXPECT_GT(second.epoch(), first.epoch());
}

// The primary's release keeps its key holding every LU (gate closed), so the LUs are never left
// unreserved and its epoch stays on them: the next promote draws above it and preempts it.
TEST_F(PrimaryTest, ThePrimarysReleaseKeepsTheReservation) {
  boot_members();
  const Key first = promoted(*a);
  Outcome* released = a->release();
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  ASSERT_TRUE(released->result->has_value()) << released->result->error().message();
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kReleased);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), first.value()) << "a RELEASE would leave LU " << lu << " unreserved";
  }
  const Key second = promoted(*b);
  EXPECT_GT(second.epoch(), first.epoch());
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), second.value());
  }
}

// The fenced old primary rejoins by unfence with a new epoch above every key on the LUs (never
// epoch 0, which a holding nexus would carry onto the reservation); the primary keeps holding.
TEST_F(PrimaryTest, AFencedPrimaryRejoinsWithANewEpoch) {
  boot_members();
  const Key first = promoted(*a);
  const Key second = promoted(*b);
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  Outcome* rejoined = a->unfence();
  ASSERT_TRUE(run_until([&] { return rejoined->done(); }));
  ASSERT_TRUE(rejoined->result->has_value()) << rejoined->result->error().message();
  const Key member = **rejoined->result;
  EXPECT_EQ(member, key_of(kNodeA, second.epoch() + 1));
  EXPECT_GT(member.epoch(), first.epoch());
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kUnfenced);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), second.value());
    EXPECT_EQ(keys_on(lu),
              (std::vector<std::uint64_t>{member.value(), member.value(), second.value()}));
  }
  EXPECT_EQ(b->resource->state(), State::kHeld);
}

TEST_F(PrimaryTest, OnlyPrimaryModePromotes) {
  a->boot(a->options(Mode::kShared));
  Outcome* shared = a->promote();
  ASSERT_TRUE(shared->done());
  EXPECT_EQ(shared->result->error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(shared->result->error().message().find("\"primary\""), std::string::npos);
  b->boot(b->options(Mode::kExclusive));
  Outcome* exclusive = b->promote();
  ASSERT_TRUE(exclusive->done());
  EXPECT_EQ(exclusive->result->error().code(), ErrorCode::kInvalidArgument);
  Outcome* acquire = a->acquire();
  ASSERT_TRUE(acquire->done());
  EXPECT_EQ(acquire->result->error().code(), ErrorCode::kInvalidArgument);
}

// The caller of a promote went away (Patroni killed its pre_promote) after the promote registered
// its new key: the promote sends no PREEMPT, A stays the primary, and B stays a member with its
// gate open (a replica keeps writing).
TEST_F(PrimaryTest, ACancelledPromoteNeverPreempts) {
  boot_members();
  const Key first = promoted(*a);
  const std::size_t registers = prouts_by(kNodeB, kRegisterAndIgnore);
  Outcome* promote = b->promote();
  ASSERT_TRUE(run_until([&] { return prouts_by(kNodeB, kRegisterAndIgnore) > registers; }));
  b->resource->cancel();
  ASSERT_TRUE(run_until([&] { return promote->done(); }));
  ASSERT_FALSE(promote->result->has_value());
  EXPECT_EQ(promote->result->error().code(), ErrorCode::kCancelled);
  EXPECT_EQ(prouts_by(kNodeB, kPreempt), 0U);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), first.value());
  }
  EXPECT_TRUE(b->resource->gate_open());
  EXPECT_EQ(b->resource->state(), State::kUnfenced);
  EXPECT_TRUE(a->resource->gate_open());
  (void)run_until([] { return false; }, 3 * kCheckInterval);
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_TRUE(b->resource->gate_open());

  // cancel() with nothing running does nothing: the next promote goes through.
  b->resource->cancel();
  EXPECT_GT(promoted(*b).epoch(), b->resource->key()->epoch() - 1);
  EXPECT_EQ(holder_of(0), b->resource->key()->value());
}

// The same for an exclusive acquire cancelled at once: it sends no PR OUT that takes a LU.
TEST_F(PrimaryTest, ACancelledAcquireNeverPreempts) {
  a->boot(a->options());
  b->boot(b->options());
  const Key held = acquired(*a);
  Outcome* acquire = b->acquire();
  b->resource->cancel();
  ASSERT_TRUE(run_until([&] { return acquire->done(); }));
  ASSERT_FALSE(acquire->result->has_value());
  EXPECT_EQ(acquire->result->error().code(), ErrorCode::kCancelled);
  EXPECT_EQ(prouts_by(kNodeB, kPreempt), 0U);
  EXPECT_EQ(holder_of(0), held.value());
  EXPECT_TRUE(a->resource->gate_open());
}

// A promote that cannot reach one LU fails; B stays a member with its gate open, and A the primary.
TEST_F(PrimaryTest, AFailedPromoteLeavesAMemberAMember) {
  boot_members();
  const Key first = promoted(*a);
  b->transport->set_link(LuId{1}, LinkState::kNoAnswer);
  Outcome* promote = b->promote();
  ASSERT_TRUE(run_until([&] { return promote->done(); }));
  ASSERT_FALSE(promote->result->has_value());
  EXPECT_EQ(holder_of(1), first.value());
  b->transport->set_link(LuId{1}, LinkState::kUp);
  ASSERT_TRUE(run_until([&] { return b->resource->gate_open(); }));
  EXPECT_EQ(b->resource->state(), State::kUnfenced);
  EXPECT_EQ(a->resource->state(), State::kHeld);
  // Retrying works once the path is back, and fences A.
  const Key second = promoted(*b);
  EXPECT_GT(second.epoch(), first.epoch());
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
}

// A restarted primary whose key holds every LU with the stored epoch is the primary again; a
// restarted member is a member again, with the LUs unreserved or not.
TEST_F(PrimaryTest, ARestartAdoptsThePrimaryAndTheMember) {
  boot_members();
  const Key first = promoted(*a);
  a->crash();
  b->crash();
  a->boot(primary(*a));
  b->boot(primary(*b));
  a->resource->start(now());
  b->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open() && b->resource->gate_open(); }));
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_EQ(a->resource->key(), first);
  EXPECT_EQ(b->resource->state(), State::kUnfenced);
  EXPECT_EQ(b->resource->key(), members[1]);
}

// A's promote's REGISTER AND IGNORE EXISTING KEY on LU 1's second path is held at the target past
// its timeout, and A's daemon dies while it is held. The restarted daemon's promote waits until
// that REGISTER can no longer execute (the epoch file says one was under way; status says why), so
// no older key of A's is left beside the new primary's once it executed.
TEST_F(PrimaryTest, APromoteAfterARestartWaitsUntilTheRunBeforesRegisterCanNoLongerExecute) {
  boot_members();
  ASSERT_NO_FATAL_FAILURE(hold_first_register(*a, [&] { a->promote(); }));
  a->crash();
  a->boot(primary(*a));
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  Outcome* second = a->promote();
  ASSERT_TRUE(run_until([&] {
    return second->done() || a->resource->detail().find("before it restarted") != std::string::npos;
  })) << a->resource->detail();
  ASSERT_FALSE(second->done()) << "the promote did not wait for the run before's REGISTER";
  ASSERT_TRUE(run_until([&] { return second->done(); }, kCommandTimeout * 4));
  ASSERT_TRUE(second->result->has_value()) << second->result->error().message();
  const Key key = **second->result;
  run_for(2 * kCommandTimeout + kCheckInterval);  // past the held REGISTER, whenever it ran
  ASSERT_EQ(target.held_count(1), 0U);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    for (const std::uint64_t k : keys_on(lu)) {
      if (Key::node_of(k) == kNodeA) {
        EXPECT_EQ(k, key.value()) << "LU " << lu << " has " << Key::format(k)
                                  << " of A's beside its primary key";
      }
    }
  }
}

// The same for an unfence, right after a start whose load of the epoch file failed: the unfence
// reads the file itself (it draws a key), finds the run before's REGISTER under way, and waits.
TEST_F(PrimaryTest, AnUnfenceAfterARestartWhoseFirstLoadFailedStillWaits) {
  boot_members();
  ASSERT_NO_FATAL_FAILURE(hold_first_register(*a, [&] { a->promote(); }));
  a->crash();
  FirstLoadFails slow(a->store);
  a->boot(primary(*a), &slow);
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  ASSERT_EQ(a->resource->state(), State::kUnknown) << a->resource->detail();
  Outcome* unfenced = a->unfence();
  ASSERT_TRUE(run_until([&] {
    return unfenced->done() ||
           a->resource->detail().find("before it restarted") != std::string::npos;
  })) << a->resource->detail();
  ASSERT_FALSE(unfenced->done()) << "the unfence did not wait for the run before's REGISTER";
  ASSERT_TRUE(run_until([&] { return unfenced->done(); }, kCommandTimeout * 4));
  ASSERT_TRUE(unfenced->result->has_value()) << unfenced->result->error().message();
  const Key key = **unfenced->result;
  run_for(2 * kCommandTimeout + kCheckInterval);  // past the held REGISTER, whenever it ran
  ASSERT_EQ(target.held_count(1), 0U);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    for (const std::uint64_t k : keys_on(lu)) {
      if (Key::node_of(k) == kNodeA) {
        EXPECT_EQ(k, key.value()) << "LU " << lu << " has " << Key::format(k)
                                  << " of A's beside its member key";
      }
    }
  }
}

}  // namespace
}  // namespace blkfence::fence::test

// Proves fence::Resource's shared mode (docs/protocol.md, "Shared mode") on the bench of
// resource_test_bench.h: both nodes unfence, and one fences the other; the fenced node's monitor
// sees it even in a round where one of its reads fails; unfence and release read before their
// first PR OUT (S4).
#include <optional>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "blkfence/testing/sim_commands.h"

#include "resource_test_bench.h"

namespace blkfence::fence::test {
namespace {

// Shared mode (fence_scsi style): each node's unfence registers epoch 0 on every path and the first
// reserves; both gates open. fence_node removes the other's key on every LU, and the fenced node's
// monitor closes its gate. Exclusive-only calls are refused.
TEST_F(ResourceTest, SharedModeUnfencesBothAndFencesOne) {
  a->boot(a->options(Mode::kShared));
  b->boot(b->options(Mode::kShared));
  Outcome* unfenced_a = a->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_a->done(); }));
  ASSERT_TRUE(unfenced_a->result->has_value()) << unfenced_a->result->error().message();
  Outcome* unfenced_b = b->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_b->done(); }));
  ASSERT_TRUE(unfenced_b->result->has_value()) << unfenced_b->result->error().message();
  const Key key_a = key_of(kNodeA, 0);
  const Key key_b = key_of(kNodeB, 0);
  EXPECT_EQ(**unfenced_a->result, key_a);
  EXPECT_EQ(**unfenced_b->result, key_b);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu),
              (std::vector<std::uint64_t>{key_a.value(), key_a.value(), key_b.value()}));
    EXPECT_EQ(holder_of(lu), key_a.value()) << "the first to unfence reserves";
  }
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_TRUE(b->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kUnfenced);
  EXPECT_EQ(b->resource->state(), State::kUnfenced);

  Outcome* refused = a->acquire();
  ASSERT_TRUE(refused->done());
  EXPECT_EQ(refused->result->error().code(), ErrorCode::kInvalidArgument);
  Outcome* self = a->fence_node(kNodeA);
  ASSERT_TRUE(self->done());
  EXPECT_EQ(self->result->error().code(), ErrorCode::kInvalidArgument);

  Outcome* fenced = a->fence_node(kNodeB);
  ASSERT_TRUE(run_until([&] { return fenced->done(); }));
  ASSERT_TRUE(fenced->result->has_value()) << fenced->result->error().message();
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key_a.value(), key_a.value()}));
  }
  ASSERT_TRUE(a->recorder.last(EventKind::kFencedNode).has_value());
  EXPECT_EQ(a->recorder.last(EventKind::kFencedNode)->second.other_key, key_b.value());
  ASSERT_TRUE(run_until([&] { return b->resource->state() == State::kFenced; },
                        kCheckInterval + 4 * kLatencyMax));
  EXPECT_FALSE(b->resource->gate_open());
  EXPECT_TRUE(a->resource->gate_open());
}

// Found by tests/sim (blkfence_sim --shared): a monitor round with a failed read decided nothing in
// shared mode, so a node whose key another member removed kept its gate open until the lease ran
// out although a read that came back showed its key gone. It closes at that round now, as the held
// node of exclusive mode does
// (ResourceTest.ARoundWithAFailedReadStillFencesOnWhatItsOtherReadsShow).
TEST_F(ResourceTest, ASharedRoundWithAFailedReadStillFencesOnWhatItsOtherReadsShow) {
  a->boot(a->options(Mode::kShared));
  b->boot(b->options(Mode::kShared));
  Outcome* unfenced_a = a->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_a->done(); }));
  Outcome* unfenced_b = b->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_b->done(); }));
  ASSERT_TRUE(b->resource->gate_open());
  const auto checked = b->resource->last_success();
  ASSERT_TRUE(run_until([&] { return b->resource->last_success() != checked; }));
  const Time last_success = *b->resource->last_success();
  b->transport->set_link(LuId{1}, LinkState::kNoAnswer);
  Outcome* fenced = a->fence_node(kNodeB);
  ASSERT_TRUE(run_until([&] { return fenced->done(); }));
  ASSERT_TRUE(fenced->result->has_value()) << fenced->result->error().message();
  const Time removed = now();
  ASSERT_TRUE(run_until([&] { return !b->resource->gate_open(); }));
  EXPECT_EQ(b->resource->state(), State::kFenced);
  EXPECT_EQ(b->recorder.count(EventKind::kLostContact), 0U);
  EXPECT_LE(now(), removed + kCheckInterval + kCommandTimeout + 4 * kLatencyMax);
  EXPECT_LT(now(), last_success + kLease);
}

// Found by tests/sim (blkfence_sim --seed 178 --shared, S2): a member in lost contact reopened as
// an exclusive holder, and only while it was the only registrant (so never beside another member);
// an unfence then ran with that gate open and left it open when it failed. It reopens unfenced now,
// beside the other members, and preempts none of them.
TEST_F(ResourceTest, ASharedMemberReopensUnfencedAfterLostContact) {
  a->boot(a->options(Mode::kShared));
  b->boot(b->options(Mode::kShared));
  Outcome* unfenced_a = a->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_a->done(); }));
  Outcome* unfenced_b = b->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_b->done(); }));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(LuId(lu), LinkState::kNoAnswer);
  }
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kLostContact; }));
  EXPECT_FALSE(a->resource->gate_open());
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(LuId(lu), LinkState::kUp);
  }
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open(); }));
  EXPECT_EQ(a->resource->state(), State::kUnfenced);
  (void)run_until([] { return false; }, 4 * kCheckInterval);  // a few more rounds
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    const std::vector<std::uint64_t> keys = keys_on(lu);
    EXPECT_NE(std::find(keys.begin(), keys.end(), key_of(kNodeB, 0).value()), keys.end());
  }
  EXPECT_TRUE(b->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kUnfenced);
}

// Found by tests/sim (blkfence_sim --seed 1048558111826 --shared, S4): the monitor's RESERVE
// failed while the next round's reads were out, and that round, issued before the failure, sent the
// RESERVE again without a read that could show what the first did. Here b holds, its daemon stops,
// and an operator RELEASEs the reservation through b's nexus (`blkfencectl device release`); a's
// monitor reserves; its first RESERVE on each LU is lost (it times out), and the reads of the round
// issued while it is out are slow enough to come back after that.
TEST_F(ResourceTest, TheMonitorReservesAgainOnlyOnAReadIssuedAfterItsLastReserveWasAnswered) {
  b->boot(b->options(Mode::kShared));
  a->boot(a->options(Mode::kShared));
  Outcome* unfenced_b = b->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_b->done(); }));
  Outcome* unfenced_a = a->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced_a->done(); }));
  b->crash();
  std::set<LuId> dropped;
  std::optional<Time> first_reserve;
  a->faults = [&](const FaultContext& c) {
    Fault fault;
    const bool reserve =
        c.command.cdb[0] == 0x5f &&
        (c.command.cdb[1] & 0x1fU) == static_cast<std::uint8_t>(PrOutAction::kReserve);
    if (reserve && dropped.insert(c.lu).second) {
      first_reserve = first_reserve.value_or(c.now);
      fault.drop_request = true;
    } else if (c.command.cdb[0] == 0x5e && first_reserve &&
               c.now >= *first_reserve + kCommandTimeout / 3 &&
               c.now < *first_reserve + kCommandTimeout) {
      fault.request_delay = kCommandTimeout / 2;
    }
    return fault;
  };
  const std::size_t before = sent.size();
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    prout_directly(nexus_of(kNodeB, lu, 0), static_cast<LuId>(lu),
                   codec::prout_release(key_of(kNodeB, 0).value(), kWeAr));
    ASSERT_FALSE(holder_of(lu).has_value());
  }
  ASSERT_TRUE(run_until([&] {
    for (std::size_t lu = 0; lu < kLus; ++lu) {
      if (holder_of(lu) != key_of(kNodeA, 0).value()) {
        return false;
      }
    }
    return true;
  }));
  ASSERT_TRUE(first_reserve.has_value());
  const std::vector<Sent> mine = a->sent_since(before);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    bool first_seen = false;
    bool read_since = false;
    for (const Sent& s : mine) {
      if (s.lu != lu) {
        continue;
      }
      if (s.is(PrOutAction::kReserve)) {
        EXPECT_TRUE(!first_seen || read_since)
            << "LU " << lu << ": RESERVE again at " << s.at.count()
            << " ns without a read issued after the first one was answered";
        first_seen = true;
      } else if (!s.is_prout() && first_seen && s.at >= *first_reserve + kCommandTimeout) {
        read_since = true;
      }
    }
  }
}

// Both nodes unfenced in shared mode, then A fences B.
class SharedTest : public ResourceTest {
 protected:
  void both_unfenced_and_b_fenced() {
    a->boot(a->options(Mode::kShared));
    b->boot(b->options(Mode::kShared));
    for (Node* node : {a.get(), b.get()}) {
      Outcome* unfenced = node->unfence();
      ASSERT_TRUE(run_until([&] { return unfenced->done(); }));
      ASSERT_TRUE(unfenced->result->has_value()) << unfenced->result->error().message();
    }
    Outcome* fenced = a->fence_node(kNodeB);
    ASSERT_TRUE(run_until([&] { return fenced->done(); }));
    ASSERT_TRUE(fenced->result->has_value()) << fenced->result->error().message();
  }
};

// Found by tests/sim (blkfence_sim --seed 252 --shared --recovery --strict-epochs, S1, once the
// checker no longer excused writes on an unreserved LU): a fenced member's write landed after the
// last member released, because the release (RELEASE, then unregister) left the LUs unreserved.
// Under the All Registrants type the reservation stays while any member is registered, and a
// release moves the member's nexuses to the departed key instead of unregistering them: sending
// no RELEASE, it leaves the LUs reserved, and the fenced member's writes are refused.
TEST_F(SharedTest, TheLastMemberToReleaseLeavesTheLusReservedAgainstAFencedMember) {
  ASSERT_NO_FATAL_FAILURE(both_unfenced_and_b_fenced());
  const std::size_t before = sent.size();
  Outcome* released = a->release();
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  ASSERT_TRUE(released->result->has_value()) << released->result->error().message();
  EXPECT_FALSE(a->resource->gate_open());
  const Key departed = key_of(kNodeA, Key::kEpochDeparted);
  for (const Sent& s : a->sent_since(before)) {
    EXPECT_FALSE(s.is(PrOutAction::kRelease)) << "LU " << s.lu << ": a RELEASE";
  }
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_TRUE(holder_of(lu).has_value()) << "LU " << lu << " was left unreserved";
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{departed.value(), departed.value()}));
    // The first try reports the unit attention of b's preempted registration.
    std::uint8_t stale = 0x02;
    for (int attempt = 0; attempt < 3 && stale == 0x02; ++attempt) {
      stale = target
                  .execute(static_cast<LuId>(lu), nexus_of(kNodeB, lu, 0),
                           transport::test::write_command(9, 0xb1))
                  .status;
    }
    EXPECT_EQ(stale, 0x18) << "LU " << lu << ": the fenced member's write was not refused";
  }
  // A restart does not take the departed key for a member's: only an unfence opens the gate, and
  // it moves the nexuses back to the member's key.
  a->crash();
  a->boot(a->options(Mode::kShared));
  run_for(4 * kCheckInterval);
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_NE(a->resource->state(), State::kUnfenced);
  Outcome* again = a->unfence();
  ASSERT_TRUE(run_until([&] { return again->done(); }));
  ASSERT_TRUE(again->result->has_value()) << again->result->error().message();
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu),
              (std::vector<std::uint64_t>{key_of(kNodeA, 0).value(), key_of(kNodeA, 0).value()}));
  }
}

// A release's REGISTER to the departed key times out on LU 1 and executes later. The unfence that
// follows at once waits until it has executed (or can no longer): run after the unfence's REGISTER
// AND IGNORE EXISTING KEY, it would move that nexus off the member's key again, and the node's
// monitor would take itself for fenced.
TEST_F(ResourceTest, AnUnfenceWaitsForAReleasesLateMoveToTheDepartedKey) {
  a->boot(a->options(Mode::kShared));
  Outcome* unfenced = a->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced->done(); }));
  ASSERT_TRUE(unfenced->result->has_value()) << unfenced->result->error().message();
  const Key member = key_of(kNodeA, 0);
  const Key departed = key_of(kNodeA, Key::kEpochDeparted);
  a->faults = [&](const FaultContext& c) {
    Fault fault;
    if (c.lu == 1 && c.command.cdb[0] == 0x5f &&
        (c.command.cdb[1] & 0x1fU) == static_cast<std::uint8_t>(PrOutAction::kRegister) &&
        c.command.data_out.size() >= 16 && load_be64(c.command.data_out, 8) == departed.value()) {
      fault.request_delay = 2 * kCommandTimeout;  // out of time, executes later
    }
    return fault;
  };
  Outcome* released = a->release();
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  Outcome* again = a->unfence();
  ASSERT_TRUE(run_until([&] { return again->done(); }));
  ASSERT_TRUE(again->result->has_value()) << again->result->error().message();
  run_for(2 * kCommandTimeout + 4 * kCheckInterval);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{member.value(), member.value()}))
        << "LU " << lu;
  }
  EXPECT_EQ(a->resource->state(), State::kUnfenced);
  EXPECT_TRUE(a->resource->gate_open());
}

// A member fenced before its release sends nothing that registers: its release's REGISTER names
// the member's key, which its nexuses no longer carry, so the target refuses it (S5).
TEST_F(SharedTest, AFencedMembersReleaseRegistersNothing) {
  ASSERT_NO_FATAL_FAILURE(both_unfenced_and_b_fenced());
  Outcome* released = b->release();
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu),
              (std::vector<std::uint64_t>{key_of(kNodeA, 0).value(), key_of(kNodeA, 0).value()}));
  }
}

// Found by tests/sim (blkfence_sim --shared, S4): an unfence after one whose REGISTER timed out
// registered again, and a release sent its RELEASE, without reading what the failed PR OUT did.
// Both read every LU first now.
TEST_F(ResourceTest, UnfenceAndReleaseReadEveryLuBeforeTheirFirstPrOut) {
  a->boot(a->options(Mode::kShared));
  a->transport->set_link(LuId{1}, LinkState::kNoAnswer);
  Outcome* failed = a->unfence();
  ASSERT_TRUE(run_until([&] { return failed->done(); }));
  ASSERT_FALSE(failed->result->has_value());
  a->transport->set_link(LuId{1}, LinkState::kUp);
  const auto read_first = [&](std::size_t from) {
    const std::vector<Sent> mine = a->sent_since(from);
    for (std::size_t lu = 0; lu < kLus; ++lu) {
      const auto first =
          std::find_if(mine.begin(), mine.end(), [lu](const Sent& s) { return s.lu == lu; });
      ASSERT_NE(first, mine.end());
      EXPECT_FALSE(first->is_prout()) << "LU " << lu << ": a PR OUT before any read";
    }
  };
  std::size_t before = sent.size();
  Outcome* unfenced = a->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced->done(); }));
  ASSERT_TRUE(unfenced->result->has_value()) << unfenced->result->error().message();
  read_first(before);
  before = sent.size();
  Outcome* released = a->release();
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  ASSERT_TRUE(released->result->has_value()) << released->result->error().message();
  read_first(before);
}

}  // namespace
}  // namespace blkfence::fence::test

// Proves fence::Resource's monitor (docs/protocol.md, "Monitor") on the bench of
// resource_test_bench.h: lost contact fails closed after the lease and reopens only for a
// still-sole holder, on a check younger than the lease, or ends fenced when another node took over;
// a round with a failed read fences on what its other reads show; strays ranking below the
// holder's key are preempted one check_interval after they are first seen, keys above it once an
// acquire could no longer be running, less and less often when they keep coming back but never
// later than stray_bound() after they appear, and again only on a round issued after the last
// PREEMPT was answered (S4); a
// fenced node never registers again by itself (S5); a fence seen half before the preempt names the
// preemptor.
#include <gtest/gtest.h>

#include "resource_test_bench.h"

namespace blkfence::fence::test {
namespace {

// The holder's PREEMPTs of a stray key (one of its cluster, not its own), as sent.
std::vector<Sent> stray_preempts(const std::vector<Sent>& mine, std::uint64_t stray) {
  std::vector<Sent> found;
  std::copy_if(mine.begin(), mine.end(), std::back_inserter(found), [stray](const Sent& s) {
    return (s.is(PrOutAction::kPreempt) || s.is(PrOutAction::kPreemptAndAbort)) &&
           s.sa_key == stray;
  });
  return found;
}

// How many READ KEYS of LU lu are among the commands, sent before `until`.
std::size_t keys_reads_before(const std::vector<Sent>& mine, LuId lu, Time until) {
  return static_cast<std::size_t>(std::count_if(mine.begin(), mine.end(), [&](const Sent& s) {
    return s.opcode == 0x5e && s.lu == lu && s.at < until &&
           s.action == static_cast<std::uint8_t>(codec::PrInAction::kReadKeys);
  }));
}

// Storage unreachable (no answers at all): the gate closes no later than `lease` after the last
// successful check began, and reopens, with the same key, once a check sees it is still the sole
// holder.
TEST_F(ResourceTest, LostContactClosesTheGateAfterTheLeaseAndReopensForASoleHolder) {
  a->boot(a->options());
  const Key key = acquired(*a);
  run_for(milliseconds(230));
  const Time cut = now();
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kNoAnswer);
  }
  ASSERT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
  const Time closed = a->recorder.gates.back().at;
  EXPECT_LE(closed, cut + kLease);
  EXPECT_GE(closed, cut + kLease - kCheckInterval - 2 * kLatencyMax);
  EXPECT_EQ(closed, *a->resource->last_success() + kLease);
  EXPECT_EQ(a->resource->state(), State::kLostContact);
  EXPECT_EQ(a->recorder.count(EventKind::kLostContact), 1U);

  run_for(kLease);  // still nothing: stays closed
  EXPECT_FALSE(a->resource->gate_open());
  const Time back = now();
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kUp);
  }
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open(); }));
  // A read already in flight must time out first: then it fails over to the other path, which
  // answers, or (sent to it before the link came back) times out there too and the next check
  // sees the key. Either way the check that reopens was issued less than a timeout before.
  EXPECT_LE(now() - back, kCheckInterval + kCommandTimeout + 4 * kLatencyMax);
  EXPECT_GT(a->recorder.gates.back().verified_since, back - kCommandTimeout);
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_EQ(a->resource->key(), key);
  EXPECT_EQ(a->recorder.count(EventKind::kContactRestored), 1U);
}

// A resume from suspend, or a loop stalled past the lease: time has jumped and on_time() has not
// run yet, so gate_open() still says open. What a caller is told (gate_open_at) is already closed:
// the last successful check is as old as the lease.
TEST_F(ResourceTest, TheGateIsNotReportedOpenOnceTheLastCheckIsAsOldAsTheLease) {
  a->boot(a->options());
  acquired(*a);
  run_for(milliseconds(230));
  const Time checked = *a->resource->last_success();
  EXPECT_TRUE(a->resource->gate_open_at(checked + kLease - std::chrono::nanoseconds(1)));
  EXPECT_FALSE(a->resource->gate_open_at(checked + kLease));
  EXPECT_FALSE(a->resource->gate_open_at(checked + 10 * kLease));
  EXPECT_TRUE(a->resource->gate_open()) << "the loop has not run past the lease: still open inside";
}

// S2: in lost contact, a check that completes a lease or more after it was issued does not reopen
// the gate, even though it shows our key as the sole holder: the gate would open with its lease
// already over (and close again in the same instant). A later prompt round reopens it. The lease
// is shortened here so that one round can outlast it within the command timeout.
TEST_F(ResourceTest, LostContactDoesNotReopenOnACheckSlowerThanTheLease) {
  ResourceOptions options = a->options();
  options.check_interval = milliseconds(10);
  options.lease = milliseconds(40);
  a->boot(options);
  const Key key = acquired(*a);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kNoAnswer);
  }
  ASSERT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
  ASSERT_EQ(a->resource->state(), State::kLostContact);
  const std::size_t closed = a->recorder.gates.size();

  // Contact is back, but every answer takes longer than the lease (within the command timeout).
  a->faults = [](const FaultContext& c) {
    Fault fault;
    if (c.command.cdb[0] == 0x5e) {
      fault.response_delay = milliseconds(60);
    }
    return fault;
  };
  const Time slow = now();
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kUp);
  }
  // Rounds issued from here on read every LU, and show our key alone, holding.
  ASSERT_TRUE(run_until([&] { return a->resource->last_read_ok() >= slow; }));
  const Counters first = a->resource->counters();
  run_for(4 * options.lease);
  const Counters later = a->resource->counters();
  EXPECT_GE((later.checks - later.check_failures) - (first.checks - first.check_failures), 2U)
      << "several slow rounds read every LU";
  EXPECT_GE(later.check_latency_last, options.lease);
  EXPECT_EQ(a->recorder.gates.size(), closed) << "the gate moved on a round slower than the lease";
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kLostContact);
  EXPECT_EQ(a->recorder.count(EventKind::kContactRestored), 0U);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key.value(), key.value()}));
    EXPECT_EQ(holder_of(lu), key.value());
  }

  a->faults = nullptr;
  const Time prompt = now();
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open(); }));
  EXPECT_GE(a->recorder.gates.back().verified_since, prompt);
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_EQ(a->resource->key(), key);
  EXPECT_EQ(a->recorder.count(EventKind::kContactRestored), 1U);
  EXPECT_EQ(a->recorder.count(EventKind::kLostContact), 1U);
}

// Lost contact while another node took the LUs: when contact returns the node is fenced and its
// gate stays closed.
TEST_F(ResourceTest, LostContactEndsFencedWhenAnotherNodeTookOver) {
  a->boot(a->options());
  b->boot(b->options());
  (void)acquired(*a);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kNoAnswer);
  }
  ASSERT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
  const Key key_b = acquired(*b);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kUp);
  }
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  run_for(kLease);
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_EQ(a->recorder.count(EventKind::kContactRestored), 0U);
  EXPECT_EQ(a->resource->fenced_by(), key_b.value());
}

// One LU stops answering A just as B takes over: A's next round reads B's key on the other LUs
// while its read of that LU times out. That read proves nothing, but the others prove the fence:
// A is fenced as that round ends, not left open until the lease runs out and then "lost contact".
TEST_F(ResourceTest, ARoundWithAFailedReadStillFencesOnWhatItsOtherReadsShow) {
  a->boot(a->options());
  b->boot(b->options());
  (void)acquired(*a);
  const auto checked = a->resource->last_success();
  ASSERT_TRUE(run_until([&] { return a->resource->last_success() != checked; }));
  const Time last_success = *a->resource->last_success();
  a->transport->set_link(LuId{1}, LinkState::kNoAnswer);
  const Key key_b = acquired(*b);
  const Time preempted = now();
  ASSERT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
  EXPECT_EQ(a->resource->state(), State::kFenced);
  EXPECT_EQ(a->resource->fenced_by(), key_b.value());
  EXPECT_EQ(a->recorder.count(EventKind::kLostContact), 0U);
  // The round ends when that LU's read has timed out on each of A's two paths (docs/protocol.md,
  // "Reads and paths"): on this bench, just as the lease would run out.
  EXPECT_LE(now(), preempted + kCheckInterval + 2 * kCommandTimeout + 4 * kLatencyMax);
  EXPECT_LE(now(), last_success + kLease);
}

// A stray is preempted only once a keys read at least one check_interval after the first that
// showed it still shows it, so that an acquire still running on its node has sent its PR OUTs
// before the holder removes its registration (two nodes' PR OUTs that meet there can deadlock
// LIO; docs/operations.md).
TEST_F(ResourceTest, AStrayIsPreemptedOneCheckIntervalAfterItIsFirstSeen) {
  b->boot(b->options());
  const Key key_b = acquired(*b);
  const std::uint64_t stray = key_of(kNodeA, key_b.epoch() - 1).value();
  const std::size_t before = sent.size();
  register_directly(nexus_of(kNodeA, 0, 0), 0, stray);
  ASSERT_TRUE(run_until([&] { return keys_on(0).size() == 1; }));
  const auto mine = b->sent_since(before);
  const auto preempts = stray_preempts(mine, stray);
  ASSERT_EQ(preempts.size(), 1U);
  ASSERT_GE(keys_reads_before(mine, 0, preempts[0].at), 2U);
  const auto first_read = std::find_if(mine.begin(), mine.end(), [](const Sent& s) {
    return s.opcode == 0x5e && s.lu == 0 &&
           s.action == static_cast<std::uint8_t>(codec::PrInAction::kReadKeys);
  });
  EXPECT_GE(preempts[0].at - first_read->at, kCheckInterval);
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key_b.value()}));
  EXPECT_TRUE(b->resource->gate_open());
}

// Found by tests/sim (blkfence_sim --seed 56117258073, S4): the holder's PREEMPT of a stray got
// RESERVATION CONFLICT (the stray had unregistered meanwhile), and a round issued before that
// answer, which ended later because one of its reads timed out and was sent again, preempted the
// stray again on its word. Here the first PREEMPT is lost (it times out), and the READ KEYS of LU 1
// in the second round issued while it is out is lost too, so that round ends after the PREEMPT's
// answer and after the stray's back-off.
TEST_F(ResourceTest, TheMonitorPreemptsAStrayAgainOnlyOnAReadIssuedAfterItsLastPreemptWasAnswered) {
  // a has two paths to each LU: a read that times out is sent again on the other. Rounds come
  // often enough that two begin while the PREEMPT is out.
  ResourceOptions options = a->options();
  options.check_interval = kCommandTimeout / 4;
  a->boot(options);
  const Key key_a = acquired(*a);
  const std::uint64_t stray = key_of(kNodeB, key_a.epoch() - 1).value();
  std::optional<Time> first_preempt;
  bool read_dropped = false;
  a->faults = [&](const FaultContext& c) {
    Fault fault;
    const auto action = static_cast<PrOutAction>(c.command.cdb[1] & 0x1fU);
    const bool preempt = c.command.cdb[0] == 0x5f && (action == PrOutAction::kPreempt ||
                                                      action == PrOutAction::kPreemptAndAbort);
    const bool keys =
        c.command.cdb[0] == 0x5e &&
        (c.command.cdb[1] & 0x1fU) == static_cast<std::uint8_t>(codec::PrInAction::kReadKeys);
    if (preempt && !first_preempt) {
      first_preempt = c.now;
      fault.drop_request = true;
    } else if (keys && c.lu == LuId{1} && first_preempt && !read_dropped &&
               c.now >= *first_preempt + 2 * options.check_interval &&
               c.now < *first_preempt + kCommandTimeout) {
      read_dropped = true;
      fault.drop_request = true;
    }
    return fault;
  };
  const std::size_t before = sent.size();
  register_directly(nexus_of(kNodeB, 0, 0), 0, stray);
  const auto stray_gone = [&] {
    const std::vector<std::uint64_t> keys = keys_on(0);
    return std::find(keys.begin(), keys.end(), stray) == keys.end();
  };
  ASSERT_TRUE(run_until(stray_gone));
  ASSERT_TRUE(first_preempt.has_value());
  ASSERT_TRUE(read_dropped) << "no round was issued while the first PREEMPT was out";
  const auto mine = a->sent_since(before);
  const auto preempts = stray_preempts(mine, stray);
  ASSERT_GE(preempts.size(), 2U);
  for (const Sent& again : std::vector<Sent>(preempts.begin() + 1, preempts.end())) {
    EXPECT_TRUE(std::any_of(mine.begin(), mine.end(),
                            [&](const Sent& s) {
                              return !s.is_prout() && s.lu == again.lu &&
                                     s.at >= *first_preempt + kCommandTimeout && s.at < again.at;
                            }))
        << "PREEMPT again at " << again.at.count()
        << " ns without a read issued after the first one was answered";
  }
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key_a.value(), key_a.value()}));
  EXPECT_TRUE(a->resource->gate_open());
}

// A key of the cluster that outranks the holder's, left by a node that died between its REGISTERs
// and its take: the holder leaves it for an acquire window (a live acquire takes over or gives up
// within it), then preempts it, well within stray_bound() of its registration, and keeps its gate.
TEST_F(ResourceTest, AKeyAboveOursIsLeftForAnAcquireWindowThenPreempted) {
  b->boot(b->options());
  const Key key_b = acquired(*b);
  const std::uint64_t stray = key_of(kNodeA, key_b.epoch() + 1).value();
  const Time window = acquire_window(b->options(), kCommandTimeout);
  const Time bound = stray_bound(b->options(), kCommandTimeout);
  ASSERT_GT(window, 10 * kCheckInterval) << "the test needs a window of many rounds";
  const std::size_t before = sent.size();
  const Time registered = now();
  register_directly(nexus_of(kNodeA, 0, 0), 0, stray);
  ASSERT_TRUE(run_until([&] { return keys_on(0).size() == 1; }, 2 * bound));
  const auto preempts = stray_preempts(b->sent_since(before), stray);
  ASSERT_EQ(preempts.size(), 1U);
  EXPECT_GE(preempts[0].at - registered, window) << "a racing acquire gets its window";
  EXPECT_LE(now() - registered, bound);
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key_b.value()}));
  EXPECT_TRUE(b->resource->gate_open());
  EXPECT_EQ(b->resource->key(), key_b);
}

// A node whose stray registration comes back each time it is preempted (it re-registers by itself,
// breaking S5) is preempted after 2, 4, 8, ... check intervals, not at every round: the holder does
// not drive a preempt/re-register cycle at the monitor's rate. The back-off stops growing at the
// acquire window, so that every stray still goes within stray_bound(). A node that then stays away
// for its whole window is forgotten, and its next stray is preempted one interval after it is
// seen.
TEST_F(ResourceTest, AStrayThatKeepsComingBackIsPreemptedLessAndLessOften) {
  b->boot(b->options());
  const Key key_b = acquired(*b);
  const std::uint64_t stray = key_of(kNodeA, key_b.epoch() - 1).value();
  const std::size_t before = sent.size();
  const Time end = now() + 70 * kCheckInterval;
  while (now() < end) {
    if (keys_on(0).size() == 1) {
      register_directly(nexus_of(kNodeA, 0, 0), 0, stray);
    }
    run_for(milliseconds(5));
  }
  const auto preempts = stray_preempts(b->sent_since(before), stray);
  const Time window = acquire_window(b->options(), kCommandTimeout);
  ASSERT_LT(window, 32 * kCheckInterval) << "the test needs the window to cap the back-off";
  ASSERT_GE(preempts.size(), 6U) << "70 intervals hold 1 + 2 + 4 + 8 + 16 + 18 + 18";
  EXPECT_LE(preempts.size(), 7U);
  for (std::size_t i = 1; i < preempts.size(); ++i) {
    const int shift = std::min<int>(static_cast<int>(i), 6);
    const Time gap = preempts[i].at - preempts[i - 1].at;
    EXPECT_GE(gap, std::min(kCheckInterval * (1 << shift), window)) << "gap after preempt " << i;
    EXPECT_LE(gap, stray_bound(b->options(), kCommandTimeout)) << "gap after preempt " << i;
  }
  EXPECT_TRUE(b->resource->gate_open());

  ASSERT_TRUE(run_until([&] { return keys_on(0).size() == 1; }, 70 * kCheckInterval));
  run_for(70 * kCheckInterval);
  const std::size_t later = sent.size();
  const Time back = now();
  register_directly(nexus_of(kNodeA, 0, 0), 0, stray);
  ASSERT_TRUE(run_until([&] { return keys_on(0).size() == 1; }));
  const auto mine = b->sent_since(later);
  const auto again = stray_preempts(mine, stray);
  ASSERT_EQ(again.size(), 1U);
  EXPECT_LE(again[0].at - back, (b->options().keys_every + 2) * kCheckInterval);
  EXPECT_GE(keys_reads_before(mine, 0, again[0].at), 2U) << "a fresh stray waits one interval";
}

// S5: once fenced, the node sends no PR OUT at all (and so never registers) through many monitor
// rounds, unit attentions and lost answers included; only the next explicit acquire registers,
// with an epoch above the one that fenced it.
TEST_F(ResourceTest, AFencedNodeNeverRegistersUntilAskedToAcquire) {
  a->boot(a->options());
  b->boot(b->options());
  (void)acquired(*a);
  const Key key_b = acquired(*b);
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  const std::size_t before = sent.size();
  std::uint64_t draws = 0;
  a->faults = [&draws](const FaultContext&) {
    Fault fault;
    ++draws;
    if (draws % 3 == 0) {
      fault.unit_attention = transport::kUaRegistrationsPreempted;
    } else if (draws % 7 == 0) {
      fault.drop_response = true;
    }
    return fault;
  };
  run_for(20 * kCheckInterval);
  const auto mine = a->sent_since(before);
  EXPECT_FALSE(mine.empty()) << "the monitor keeps reading";
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  EXPECT_EQ(a->resource->state(), State::kFenced);
  EXPECT_FALSE(a->resource->gate_open());

  a->faults = nullptr;
  const std::size_t asked = sent.size();
  const Key key = acquired(*a);
  EXPECT_GT(key.epoch(), key_b.epoch());
  const auto registers = a->sent_since(asked);
  EXPECT_TRUE(std::any_of(registers.begin(), registers.end(),
                          [&](const Sent& s) { return s.registers() && s.sa_key == key.value(); }));
}

// A round whose READ RESERVATION ran before the preempt and whose READ KEYS ran after it sees our
// own key as the holder and our key gone: the fence is reported as by the key registered instead.
TEST_F(ResourceTest, AFenceSeenHalfBeforeThePreemptNamesThePreemptor) {
  a->boot(a->options());
  const Key key_a = acquired(*a);
  bool armed = true;
  bool delayed = false;
  a->faults = [&](const FaultContext& c) {
    Fault fault;
    if (armed && c.lu == 0 && c.command.cdb[0] == 0x5e &&
        (c.command.cdb[1] & 0x1fU) == static_cast<std::uint8_t>(codec::PrInAction::kReadKeys)) {
      fault.request_delay = milliseconds(20);
      armed = false;
      delayed = true;
    }
    return fault;
  };
  ASSERT_TRUE(run_until([&] { return delayed; }));
  run_for(milliseconds(2));  // the READ RESERVATION has executed, the READ KEYS has not
  const Key key_b = key_of(kNodeB, key_a.epoch() + 1);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    register_directly(nexus_of(kNodeB, lu, 0), lu, key_b.value());
    prout_directly(nexus_of(kNodeB, lu, 0), static_cast<LuId>(lu),
                   codec::prout_preempt(key_b.value(), key_a.value(), kWeRo));
  }
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  EXPECT_EQ(a->resource->fenced_by(), key_b.value());
  EXPECT_EQ(a->recorder.last(EventKind::kFenced)->second.other_key, key_b.value());
  a->faults = nullptr;
}

}  // namespace
}  // namespace blkfence::fence::test

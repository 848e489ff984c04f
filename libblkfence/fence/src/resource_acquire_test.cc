// Proves fence::Resource's acquire (docs/protocol.md, "Acquire") on the bench of
// resource_test_bench.h: acquire registers every path and leaves its key the holder and only
// registrant with a fresh, persisted epoch (above the persisted mark, every key seen, and a holder
// seen only in the reservation); a second acquire preempts the first, whose gate closes within one
// check_interval plus a round trip; the holder re-acquires under a new key, preempting its older
// key where that holds through a path the node no longer has, and waiting for its writes in flight
// before it re-keys the holding nexus; a second operation is refused while
// one runs; and the failure paths (unreadable LUs, an epoch store that cannot persist, a lost
// REGISTER answer, keys that cannot be read back, a verify older than the lease) open no gate, read
// before any further PR OUT, leave the loser's registration to the winner's monitor, and never
// unregister where the node's own released key holds; an acquire, in this run or after a restart,
// waits until an earlier REGISTER that timed out can no longer execute.
#include <cerrno>
#include <memory>

#include <gtest/gtest.h>

#include "blkfence/codec/sense.h"
#include "blkfence/testing/sim_commands.h"

#include "resource_test_bench.h"

namespace blkfence::fence::test {
namespace {

// Acquire on three LUs, each reached through two nexuses: REGISTER AND IGNORE goes to every path,
// the key ends as the holder and the only registrant (B's key, seen on one LU, is preempted), the
// epoch is one above the highest this cluster shows on any LU (9, above the persisted 7), it is
// persisted, and the gate opens with a verified_since no later than the moment it opened.
TEST_F(ResourceTest, AcquireRegistersEveryPathAndHoldsAloneWithAFreshPersistedEpoch) {
  ASSERT_TRUE(a->store.store("pgdata", {.used = 7, .seen = 7}).has_value());
  register_directly(nexus_of(kNodeB, 1, 0), 1, key_of(kNodeB, 9).value());
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_FALSE(a->resource->gate_open());

  const std::size_t before = sent.size();
  const Key key = acquired(*a);
  EXPECT_EQ(key, key_of(kNodeA, 10));
  EXPECT_EQ(a->stored_epoch(), 10U);
  EXPECT_EQ(a->resource->epoch_high_water(), 10U);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key.value(), key.value()})) << "LU " << lu;
    EXPECT_EQ(holder_of(lu), key.value()) << "LU " << lu;
    EXPECT_EQ(target.reservation(static_cast<LuId>(lu))->type, kWeRo);
    for (std::size_t path = 0; path < 2; ++path) {
      const auto mine = a->sent_since(before);
      EXPECT_TRUE(std::any_of(mine.begin(), mine.end(),
                              [&](const Sent& s) {
                                return s.is(PrOutAction::kRegisterAndIgnoreExistingKey) &&
                                       s.sa_key == key.value() &&
                                       s.nexus == nexus_of(kNodeA, lu, path);
                              }))
          << "no REGISTER AND IGNORE EXISTING KEY on LU " << lu << " path " << path;
    }
  }
  EXPECT_EQ(a->resource->state(), State::kHeld);
  ASSERT_TRUE(a->resource->gate_open());
  ASSERT_EQ(a->recorder.gates.size(), 1U);
  EXPECT_TRUE(a->recorder.gates[0].open);
  EXPECT_LE(a->recorder.gates[0].verified_since, a->recorder.gates[0].at);
  EXPECT_EQ(a->recorder.count(EventKind::kAcquired), 1U);
  EXPECT_EQ(a->resource->counters().acquisitions, 1U);
}

// S3: the persisted high-water mark wins when it is above every key on the LUs (a CLEAR or a LUN
// reset may have forgotten them), and a second acquire while holding returns the same key.
TEST_F(ResourceTest, EpochIsAboveThePersistedHighWaterWhenTheLusForgot) {
  ASSERT_TRUE(a->store.store("pgdata", {.used = 12, .seen = 12}).has_value());
  register_directly(nexus_of(kNodeB, 0, 0), 0, key_of(kNodeB, 9).value());
  a->boot(a->options());
  const Key key = acquired(*a);
  EXPECT_EQ(key.epoch(), 13U);
  EXPECT_EQ(a->stored_epoch(), 13U);
  EXPECT_EQ(acquired(*a), key) << "acquire while holding is a no-op";
  EXPECT_EQ(a->stored_epoch(), 13U);
}

class PreemptTest : public ResourceTest, public ::testing::WithParamInterface<bool> {};

// A second node's acquire preempts the holder on every LU with a higher epoch; the first node's
// monitor reports Fenced (naming the new holder) within one check_interval plus a round trip (and
// the unit-attention retry the preempt causes) after the preempt executed, and closes its gate.
TEST_P(PreemptTest, SecondAcquirePreemptsAndTheHolderClosesItsGateWithinACheckInterval) {
  const bool abort = GetParam();
  a->boot(a->options(Mode::kExclusive, abort));
  b->boot(b->options(Mode::kExclusive, abort));
  const Key key_a = acquired(*a);
  run_for(milliseconds(250));  // the monitor is in its stride
  ASSERT_TRUE(a->resource->gate_open());

  const Key key_b = acquired(*b);
  EXPECT_GT(key_b.epoch(), key_a.epoch());
  std::optional<Time> preempted;
  for (const auto& record : prouts_of(kNodeB)) {
    const auto action = abort ? PrOutAction::kPreemptAndAbort : PrOutAction::kPreempt;
    if (record.service_action == static_cast<std::uint8_t>(action) &&
        record.sa_key == key_a.value() && record.outcome.status == 0) {
      preempted = std::max(preempted.value_or(Time{0}), record.at);
    }
  }
  ASSERT_TRUE(preempted.has_value()) << "B's acquire did not preempt A's key";
  ASSERT_TRUE(run_until([&] { return a->recorder.count(EventKind::kFenced) > 0; }));
  const auto fenced = a->recorder.last(EventKind::kFenced);
  EXPECT_LE(fenced->first - *preempted, kCheckInterval + 2 * kLatencyMax);
  EXPECT_EQ(fenced->second.other_key, key_b.value());
  EXPECT_EQ(a->resource->state(), State::kFenced);
  EXPECT_FALSE(a->resource->gate_open());
  ASSERT_GE(a->recorder.gates.size(), 2U);
  EXPECT_FALSE(a->recorder.gates.back().open);
  EXPECT_EQ(a->recorder.gates.back().at, fenced->first);
  EXPECT_EQ(a->resource->fenced_by(), key_b.value());
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key_b.value()}));
    EXPECT_EQ(holder_of(lu), key_b.value());
  }
  EXPECT_TRUE(b->resource->gate_open());
}

INSTANTIATE_TEST_SUITE_P(PreemptOrPreemptAndAbort, PreemptTest, ::testing::Bool(),
                         [](const auto& param_info) {
                           return param_info.param ? "Abort" : "Preempt";
                         });

// An acquire by the node that still holds the reservation under an older key of its own (here
// after lost contact closed its gate; equally after an acquire that failed past its take step)
// succeeds with a fresh epoch: REGISTER AND IGNORE already moved the holder's registration to the
// new key, so there is nothing of the old key left to preempt.
TEST_F(ResourceTest, ReacquireWhileHoldingAnOlderKeyOfItsOwnSucceeds) {
  a->boot(a->options());
  const Key old_key = acquired(*a);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kNoAnswer);
  }
  ASSERT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kUp);
  }
  Outcome* outcome = a->acquire();  // before the monitor sees the key again
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_TRUE(outcome->result->has_value()) << outcome->result->error().message();
  const Key key = **outcome->result;
  EXPECT_GT(key.epoch(), old_key.epoch());
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key.value(), key.value()}));
    EXPECT_EQ(holder_of(lu), key.value());
  }
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kHeld);
}

// docs/protocol.md, "Re-keying a holding nexus": the target marks each command with the holder's
// key when it accepts it, and PREEMPT AND ABORT aborts by that mark. A write of A's accepted under
// its older key, still in the target when A re-acquires, would keep that mark after A's REGISTER
// re-keyed the holding nexus, and land after B's PREEMPT AND ABORT of A's new key (S1). So the
// REGISTER waits until A has no write in flight: the write lands first, under A's older key, and
// nothing of A's lands after B's preempt. Through one path and two.
class RekeyTest : public ResourceTest, public ::testing::WithParamInterface<std::size_t> {
 protected:
  // A holds with an older key, its gate closed by lost contact, with a write accepted under that
  // key held in the target for hold.
  Key held_with_a_write_in_flight(Time hold, std::optional<transport::SimAnswer>& answer) {
    ResourceOptions options = a->options(Mode::kExclusive, true);
    for (auto& lu : options.lus) {
      lu.paths.resize(GetParam());
    }
    options.drain_wait = std::chrono::seconds(3);
    a->boot(options);
    b->boot(b->options(Mode::kExclusive, true));
    const Key old_key = acquired(*a);
    landing = now() + hold;
    target.submit(0, nexus_of(kNodeA, 0, 0), transport::test::write_command(7, 0xa1), hold,
                  [&answer](transport::SimAnswer written) { answer = std::move(written); });
    EXPECT_EQ(target.held_count(0), 1U);
    for (std::size_t lu = 0; lu < kLus; ++lu) {
      a->transport->set_link(static_cast<LuId>(lu), LinkState::kNoAnswer);
    }
    EXPECT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
    for (std::size_t lu = 0; lu < kLus; ++lu) {
      a->transport->set_link(static_cast<LuId>(lu), LinkState::kUp);
    }
    return old_key;
  }

  Time landing{0};  // when the write takes effect

  // Whether A sent a REGISTER of a key other than old_key from index `from` on.
  bool registered_anew(std::size_t from, Key old_key) const {
    const auto mine = a->sent_since(from);
    return std::any_of(mine.begin(), mine.end(), [&](const Sent& s) {
      return s.is(PrOutAction::kRegisterAndIgnoreExistingKey) && s.sa_key != old_key.value();
    });
  }
};

TEST_P(RekeyTest, AReacquireOverItsOwnOlderKeyWaitsForItsWritesBeforeReKeying) {
  std::optional<transport::SimAnswer> answer;
  const Key old_key = held_with_a_write_in_flight(std::chrono::seconds(2), answer);
  const std::size_t before = sent.size();
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return now() >= landing - milliseconds(100); }));
  EXPECT_FALSE(outcome->done());
  EXPECT_FALSE(registered_anew(before, old_key)) << "the holding nexus was re-keyed with a write "
                                                    "of the older key in flight";
  EXPECT_NE(a->resource->detail().find("write(s) in flight"), std::string::npos)
      << a->resource->detail();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_TRUE(outcome->result->has_value()) << outcome->result->error().message();
  EXPECT_GT((*outcome->result)->epoch(), old_key.epoch());
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(answer->status, static_cast<std::uint8_t>(codec::SamStatus::kGood));

  const Key key_b = acquired(*b);
  EXPECT_GT(key_b.epoch(), (*outcome->result)->epoch());
  EXPECT_EQ(target.held_count(0), 0U);
  EXPECT_TRUE(transport::test::s1_violations(target.history()).empty());
}

// A write that does not finish within drain_wait fails the acquire with what is still in flight,
// before anything of the new key is sent; the older key keeps the reservation.
TEST_P(RekeyTest, AReacquireWhoseWritesDoNotFinishFailsWithoutReKeying) {
  std::optional<transport::SimAnswer> answer;
  const Key old_key = held_with_a_write_in_flight(std::chrono::seconds(30), answer);
  const std::size_t before = sent.size();
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_NE(outcome->result->error().message().find("lu0: 1 write(s) in flight"), std::string::npos)
      << outcome->result->error().message();
  EXPECT_FALSE(registered_anew(before, old_key));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), old_key.value()) << "LU " << lu;
  }
  EXPECT_FALSE(a->resource->gate_open());
}

INSTANTIATE_TEST_SUITE_P(OneOrTwoPaths, RekeyTest, ::testing::Values(1U, 2U),
                         [](const auto& param_info) {
                           return param_info.param == 1U ? "OnePath" : "TwoPaths";
                         });

// docs/protocol.md, "Writes queued in the initiator": a fenced node's REGISTER makes its nexuses
// registered again, and a write of its from before that is still on its way to the target, or
// held back by the initiator (a blocked SCSI device counts it nowhere), would land after it. So the
// acquire registers only once the node has no write in flight on any LU and no path holds writes
// back; a LU that was busy at one look must be clean at the next one too (a blocked device's queue
// restarts just after its state reads "running"). Meanwhile the status says what it waits for.
TEST_F(ResourceTest, AFencedNodeRegistersAgainOnlyOnceItsEarlierWritesAreDone) {
  Result<std::uint64_t> lu0 = 0;
  std::uint64_t lu1 = 0;
  int looks = 0;
  ResourceOptions options = a->options();
  options.writes_in_flight = [&](const pr::LogicalUnit& lu) -> Result<std::uint64_t> {
    if (lu.name == "lu1") {
      return lu1;
    }
    if (lu.name != "lu0") {
      return 0;
    }
    ++looks;
    return lu0;
  };
  a->boot(options);
  b->boot(b->options());
  acquired(*a);
  acquired(*b);
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  ASSERT_FALSE(a->resource->gate_open());

  const std::size_t before = sent.size();
  const auto registered = [&] {
    const auto mine = a->sent_since(before);
    return std::any_of(mine.begin(), mine.end(), [](const Sent& s) {
      return s.is(PrOutAction::kRegisterAndIgnoreExistingKey) || s.is(PrOutAction::kRegister);
    });
  };
  const auto detail_says = [&](const std::string& text) {
    return a->resource->detail().find(text) != std::string::npos;
  };
  lu0 = 2;
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return detail_says("lu0: 2 write(s) in flight"); }))
      << a->resource->detail();
  const int looks_busy = looks;
  ASSERT_TRUE(run_until([&] { return looks > looks_busy + 2; }));
  EXPECT_FALSE(registered());

  lu0 = tl::unexpected(Error::os(EBUSY, "/dev/sdb may hold writes that no count shows"));
  ASSERT_TRUE(run_until([&] { return detail_says("lu0: /dev/sdb may hold writes"); }))
      << a->resource->detail();
  EXPECT_FALSE(registered());

  // A LU clean so far that has writes again holds the REGISTER back as well.
  lu1 = 1;
  lu0 = 0;
  ASSERT_TRUE(run_until([&] { return detail_says("lu1: 1 write(s) in flight"); }))
      << a->resource->detail();
  lu1 = 0;
  ASSERT_TRUE(run_until([&] { return detail_says("lu1: none now, looking once more"); }))
      << a->resource->detail();
  EXPECT_FALSE(registered()) << "registered at the first clean look after a busy one";
  const int looks_clean = looks;
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_TRUE(outcome->result->has_value()) << outcome->result->error().message();
  EXPECT_EQ(looks, looks_clean + 1);
  EXPECT_TRUE(registered());
  EXPECT_TRUE(a->resource->gate_open());
}

// An older key of this node that holds through a nexus the node no longer has (the path went
// away; the target still has that nexus registered, holding) cannot be moved by our REGISTERs, and
// RESERVE conflicts: when the verify still sees it holding after our REGISTERs executed, the take
// preempts it like any holder. Here LU 0's first path is gone from A's paths; on LUs 1 and 2 the
// REGISTER moves the holding nexus to the new key as usual.
TEST_F(ResourceTest, AnOlderKeyOfItsOwnHoldingThroughAVanishedPathIsPreempted) {
  const std::uint64_t old_key = key_of(kNodeA, 5).value();
  ASSERT_TRUE(a->store.store("pgdata", {.used = 5, .seen = 5}).has_value());
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    for (std::size_t path = 0; path < 2; ++path) {
      register_directly(nexus_of(kNodeA, lu, path), lu, old_key);
    }
    prout_directly(nexus_of(kNodeA, lu, 0), static_cast<LuId>(lu),
                   codec::prout_reserve(old_key, kWeRo));
  }
  const NexusId vanished = nexus_of(kNodeA, 0, 0);
  ResourceOptions options = a->options();
  options.lus[0].paths.erase(options.lus[0].paths.begin());
  a->boot(options);

  const std::size_t before = sent.size();
  const Key key = acquired(*a);
  EXPECT_EQ(key, key_of(kNodeA, 6));
  EXPECT_EQ(holder_of(0), key.value());
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value()}));
  const auto registrations = target.registrations(0);
  EXPECT_TRUE(
      std::none_of(registrations.begin(), registrations.end(),
                   [&](const transport::SimRegistration& r) { return r.nexus == vanished; }))
      << "the vanished nexus is still registered";
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::any_of(mine.begin(), mine.end(), [&](const Sent& s) {
    return s.is(PrOutAction::kPreempt) && s.lu == 0 && s.sa_key == old_key;
  })) << "no PREEMPT of the old key on LU 0";
  for (std::size_t lu = 1; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), key.value()) << "LU " << lu;
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key.value(), key.value()})) << "LU " << lu;
  }
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kHeld);
}

// docs/protocol.md, "Writes queued in the initiator": while the gate is closed no queue of the host
// holds writes. An acquire stops every LU's queues before its first REGISTER and lets them queue
// again once its gate opens; a fence stops them as the gate closes; a queue that cannot be stopped
// fails the next acquire before it registers anything.
TEST_F(ResourceTest, TheHostsQueuesAreStoppedWhileTheGateIsClosedAndBeforeARegister) {
  struct Call {
    std::string lu;
    bool queue = false;
    std::size_t registers_sent = 0;  // node A's REGISTERs on the wire by then
    bool gate_open = false;
  };
  std::vector<Call> calls;
  bool refuse = false;
  ResourceOptions options = a->options();
  options.host_queueing = [&](const pr::LogicalUnit& lu, bool queue) -> Result<void> {
    const auto mine = a->sent_since(0);
    calls.push_back({lu.name, queue,
                     static_cast<std::size_t>(std::count_if(
                         mine.begin(), mine.end(), [](const Sent& s) { return s.registers(); })),
                     a->resource && a->resource->gate_open()});
    if (refuse) {
      return fail(ErrorCode::kOs, "dm-7: message fail_if_no_path: Invalid argument");
    }
    return {};
  };
  a->boot(std::move(options));
  b->boot(b->options());
  acquired(*a);
  // Stopped before the writes in flight are counted, again right before the REGISTER, and given
  // back once the gate opened.
  ASSERT_EQ(calls.size(), 3 * kLus);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    for (const std::size_t at : {lu, kLus + lu}) {
      EXPECT_EQ(calls[at].lu, "lu" + std::to_string(lu));
      EXPECT_FALSE(calls[at].queue) << "stopped first";
      EXPECT_EQ(calls[at].registers_sent, 0U) << "before any REGISTER";
    }
    EXPECT_TRUE(calls[2 * kLus + lu].queue) << "queueing again once the gate opened";
    EXPECT_TRUE(calls[2 * kLus + lu].gate_open);
    EXPECT_GT(calls[2 * kLus + lu].registers_sent, 0U);
  }

  calls.clear();
  acquired(*b);
  ASSERT_TRUE(run_until([&] { return a->recorder.count(EventKind::kFenced) > 0; }));
  ASSERT_EQ(calls.size(), kLus);
  for (const Call& call : calls) {
    EXPECT_FALSE(call.queue);
    EXPECT_FALSE(call.gate_open) << "closed before the observer hears of it";
  }
  EXPECT_FALSE(a->resource->gate_open());

  // A queue that cannot be stopped: the acquire fails with the reason, and registers nothing.
  refuse = true;
  calls.clear();
  const std::size_t before = sent.size();
  Outcome* refused = a->acquire();
  ASSERT_TRUE(run_until([&] { return refused->done(); }));
  ASSERT_FALSE(refused->result->has_value());
  EXPECT_NE(refused->result->error().message().find("could not be stopped"), std::string::npos)
      << refused->result->error().message();
  EXPECT_NE(refused->result->error().message().find("dm-7"), std::string::npos);
  const auto after = a->sent_since(before);
  EXPECT_TRUE(
      std::none_of(after.begin(), after.end(), [](const Sent& s) { return s.registers(); }));
  EXPECT_FALSE(calls.empty());
  EXPECT_FALSE(a->resource->gate_open());
}

// A daemon started again that does not hold (fenced while it was down, or the one before died
// before it could stop them) stops the host's queues as soon as its probe knows, not only before
// its next REGISTER.
TEST_F(ResourceTest, ADaemonStartedAgainNotHoldingStopsTheHostsQueues) {
  std::vector<bool> told;
  ResourceOptions options = a->options();
  options.host_queueing = [&told](const pr::LogicalUnit&, bool queue) -> Result<void> {
    told.push_back(queue);
    return {};
  };
  a->boot(options);
  b->boot(b->options());
  acquired(*a);
  a->crash();
  acquired(*b);
  told.clear();
  a->boot(options);
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_EQ(told, std::vector<bool>(kLus, false));

  // The holder's daemon started again adopts its key and opens its gate: nothing is stopped.
  b->crash();
  told.clear();
  ResourceOptions for_b = b->options();
  for_b.host_queueing = options.host_queueing;
  b->boot(for_b);
  b->resource->start(now());
  ASSERT_TRUE(run_until([&] { return b->resource->state_known(); }));
  EXPECT_TRUE(b->resource->gate_open());
  EXPECT_EQ(told, std::vector<bool>(kLus, true)) << "given back as the gate opens; none stopped";
}

// One operation at a time: acquire or release while an acquire runs is refused at once with
// kBusy, and the running acquire still completes.
TEST_F(ResourceTest, ASecondOperationIsRefusedWhileOneRuns) {
  a->boot(a->options());
  Outcome* first = a->acquire();
  EXPECT_FALSE(first->done());
  EXPECT_TRUE(a->resource->busy());
  Outcome* second = a->acquire();
  Outcome* release = a->release();
  ASSERT_TRUE(second->done());
  ASSERT_TRUE(release->done());
  EXPECT_EQ(second->result->error().code(), ErrorCode::kBusy);
  EXPECT_EQ(release->result->error().code(), ErrorCode::kBusy);
  ASSERT_TRUE(run_until([&] { return first->done(); }));
  ASSERT_TRUE(first->result->has_value()) << first->result->error().message();
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_FALSE(a->resource->busy());
}

class UnreadableTest : public ResourceTest, public ::testing::WithParamInterface<bool> {};

// When the LUs cannot be read (every path's transport fails, or no answer comes back before the
// timeout), acquire fails as kIndeterminate: no PR OUT is sent and the gate never opens.
TEST_P(UnreadableTest, AcquireFailsIndeterminateWithoutAGateOrAPrOut) {
  const bool silent = GetParam();
  a->boot(a->options());
  a->faults = [silent](const FaultContext& c) {
    Fault fault;
    if (c.command.cdb[0] == 0x5e) {
      fault.transport_error = !silent;
      fault.drop_request = silent;
    }
    return fault;
  };
  const std::size_t before = sent.size();
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(outcome->result->error().code(), ErrorCode::kIndeterminate)
      << outcome->result->error().message();
  EXPECT_TRUE(a->recorder.gates.empty() ||
              std::none_of(a->recorder.gates.begin(), a->recorder.gates.end(),
                           [](const Recorder::Gate& g) { return g.open; }));
  const auto mine = a->sent_since(before);
  EXPECT_FALSE(mine.empty());
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_EQ(a->recorder.count(EventKind::kOperationFailed), 1U);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_TRUE(keys_on(lu).empty());
  }
}

INSTANTIATE_TEST_SUITE_P(TransportErrorOrSilence, UnreadableTest, ::testing::Bool(),
                         [](const auto& param_info) {
                           return param_info.param ? "Silence" : "TransportError";
                         });

// S3: the epoch is durable before the key exists anywhere, so an epoch store that cannot write
// fails the acquire before any PR OUT.
TEST_F(ResourceTest, AcquireSendsNothingWhenTheEpochCannotBePersisted) {
  FailingStore store;
  a->boot(a->options(), &store);
  const std::size_t before = sent.size();
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(outcome->result->error().code(), ErrorCode::kOs);
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  EXPECT_FALSE(a->resource->gate_open());
  a->crash();  // before the store goes
}

// A REGISTER whose answer is lost is indeterminate (S4): the acquire reads the state again before
// sending any further PR OUT, takes nothing (nobody holds, so it reserves nothing) and fails
// without opening the gate.
TEST_F(ResourceTest, AnIndeterminateRegisterIsReadBackBeforeAnyOtherPrOut) {
  a->boot(a->options());
  a->faults = [](const FaultContext& c) {
    Fault fault;
    fault.drop_response = c.command.cdb[0] == 0x5f && c.lu == 1 && c.nexus % 10 == 1 &&
                          (c.command.cdb[1] & 0x1fU) ==
                              static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey);
    return fault;
  };
  const std::size_t before = sent.size();
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(outcome->result->error().code(), ErrorCode::kIndeterminate);
  EXPECT_FALSE(a->resource->gate_open());
  // After the lost answer: a PR IN before any further PR OUT.
  const auto mine = a->sent_since(before);
  const auto lost = std::find_if(mine.begin(), mine.end(), [](const Sent& s) {
    return s.is(PrOutAction::kRegisterAndIgnoreExistingKey) && s.lu == 1 && s.nexus % 10 == 1;
  });
  ASSERT_NE(lost, mine.end());
  const Time deadline = lost->at + kCommandTimeout;
  std::optional<Time> reread;
  for (const Sent& s : mine) {
    if (s.at >= deadline && s.opcode == 0x5e && !reread) {
      reread = s.at;
    }
    if (s.at >= deadline && s.is_prout()) {
      ASSERT_TRUE(reread.has_value()) << "a PR OUT after the timeout without reading first";
    }
  }
  EXPECT_TRUE(reread.has_value());
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_FALSE(holder_of(lu).has_value());
  }
}

// S3: READ KEYS and READ RESERVATION are separate commands, so a racer can register and take a
// LU between them; its key then shows only as the holder. The epoch is drawn above it too, so the
// take never replaces a holder (whose gate may be open) with a key of the same epoch. Here A's
// READ RESERVATIONs are held in the target until B has acquired.
TEST_F(ResourceTest, TheEpochIsAboveAHolderSeenOnlyInTheReservation) {
  a->boot(a->options());
  b->boot(b->options());
  int held = 0;
  a->faults = [&held](const FaultContext& c) {
    Fault fault;
    if (c.command.cdb[0] == 0x5e &&
        (c.command.cdb[1] & 0x1fU) ==
            static_cast<std::uint8_t>(codec::PrInAction::kReadReservation) &&
        held < static_cast<int>(kLus)) {
      ++held;
      fault.execute_delay = milliseconds(50);
    }
    return fault;
  };
  Outcome* outcome_a = a->acquire();
  run_for(milliseconds(1));
  const Key key_b = acquired(*b);
  ASSERT_TRUE(b->resource->gate_open());
  ASSERT_TRUE(run_until([&] { return outcome_a->done(); }));
  ASSERT_TRUE(outcome_a->result->has_value()) << outcome_a->result->error().message();
  EXPECT_GT((**outcome_a->result).epoch(), key_b.epoch());
  a->faults = nullptr;
}

// A failed acquire takes its key back where another node holds, and also where it cannot read
// the keys back (S4: its REGISTER may have executed there): no registration of the loser is left
// under the winner's reservation. Here B holds; A's REGISTER on LU 0 loses its answer, and so do
// A's reads of LU 2's keys afterwards.
TEST_F(ResourceTest, AFailedAcquireUnregistersWhereItCannotReadItsKeysBack) {
  a->boot(a->options());
  b->boot(b->options());
  const Key key_b = acquired(*b);
  bool registered = false;
  a->faults = [&registered](const FaultContext& c) {
    Fault fault;
    const auto action = static_cast<std::uint8_t>(c.command.cdb[1] & 0x1fU);
    if (c.command.cdb[0] == 0x5f &&
        action == static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey)) {
      registered = true;
      fault.drop_response = c.lu == 0 && c.nexus % 10 == 1;
    }
    fault.drop_response =
        fault.drop_response || (registered && c.command.cdb[0] == 0x5e && c.lu == 2 &&
                                action == static_cast<std::uint8_t>(codec::PrInAction::kReadKeys));
    return fault;
  };
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(outcome->result->error().code(), ErrorCode::kLost);
  EXPECT_FALSE(a->resource->gate_open());
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key_b.value()})) << "LU " << lu;
    EXPECT_EQ(holder_of(lu), key_b.value());
  }
  EXPECT_GT(a->stored_epoch(), key_b.epoch() + 1)
      << "one past A's given-up epoch, itself above B's";
  a->faults = nullptr;
}

// Where a PREEMPT of a failed acquire timed out, the key is not unregistered at once: had the
// PREEMPT executed first, the unregister would drop the reservation (S1). Here every PREEMPT of
// A's on LU 0 is lost on the way, so the acquire gives up with B holding LU 0 and A holding the
// others: A's key stays registered on LU 0 until the transport has every command it reported
// indeterminate back (a lost request cannot execute any more), which it knows at once here, well
// before the fixed horizon (2 x command_timeout, for transports that cannot tell); then A's
// monitor unregisters it there; on LUs 1 and 2 it keeps the reservation, gate closed.
TEST_F(ResourceTest, AFailedAcquireUnregistersWhereItsPreemptTimedOutOnceTheTransportGotItBack) {
  a->boot(a->options());
  b->boot(b->options());
  const Key key_b = acquired(*b);
  a->faults = [](const FaultContext& c) {
    Fault fault;
    const auto action = static_cast<std::uint8_t>(c.command.cdb[1] & 0x1fU);
    fault.drop_request = c.command.cdb[0] == 0x5f && c.lu == 0 &&
                         action == static_cast<std::uint8_t>(PrOutAction::kPreempt);
    return fault;
  };
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(outcome->result->error().code(), ErrorCode::kLost);
  EXPECT_NE(outcome->result->error().message().find("is not taken back from lu0"),
            std::string::npos)
      << outcome->result->error().message();
  const Time failed_at = now();
  const std::size_t before = sent.size();
  ASSERT_EQ(holder_of(0), key_b.value());
  const std::uint64_t key_a = holder_of(1).value_or(0);
  ASSERT_EQ(key_a >> 32U, (std::uint64_t{kCluster} << 16U) | kNodeA) << "A took LU 1";
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key_a, key_a, key_b.value()}));
  a->faults = nullptr;

  ASSERT_TRUE(run_until([&] { return keys_on(0) == std::vector<std::uint64_t>{key_b.value()}; }));
  const auto unregisters = a->sent_since(before);
  const auto first = std::find_if(unregisters.begin(), unregisters.end(), [](const Sent& s) {
    return s.is(PrOutAction::kRegister) && s.sa_key == 0;
  });
  ASSERT_NE(first, unregisters.end());
  EXPECT_LT(first->at - failed_at, 2 * kCommandTimeout) << "the transport knew: no horizon";
  EXPECT_EQ(first->lu, 0U);
  for (std::size_t lu = 1; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), key_a) << "LU " << lu << " keeps its reservation";
  }
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kReleased);
}

// The same, but A's first PREEMPT on LU 0 reaches the target and is held there until well after
// the acquire gave up (its later ones are lost): the transport still holds it (it may execute), so
// A's key stays registered on LU 0 until it has run; it then makes A's key the holder there, which
// is never unregistered (an unregister before it, at the first monitor round, would have left the
// PREEMPT to fail and LU 0 to B).
TEST_F(ResourceTest, AFailedAcquireWaitsForItsHeldPreemptsToComeBack) {
  a->boot(a->options());
  b->boot(b->options());
  (void)acquired(*b);
  auto preempts = std::make_shared<int>(0);
  a->faults = [preempts](const FaultContext& c) {
    Fault fault;
    const auto action = static_cast<std::uint8_t>(c.command.cdb[1] & 0x1fU);
    if (c.command.cdb[0] == 0x5f && c.lu == 0 &&
        action == static_cast<std::uint8_t>(PrOutAction::kPreempt)) {
      if ((*preempts)++ == 0) {
        fault.execute_delay = milliseconds(650);  // past the give-up and its first round
      } else {
        fault.drop_request = true;
      }
    }
    return fault;
  };
  const Time started = now();
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_LT(now() - started + kCheckInterval, milliseconds(650)) << "the hold outlasts the acquire";
  a->faults = nullptr;
  run_for(milliseconds(1000));
  const auto records = prouts_of(kNodeA);
  Time last_preempt{0};
  for (const auto& record : records) {
    if (record.lu == 0 &&
        record.service_action == static_cast<std::uint8_t>(PrOutAction::kPreempt)) {
      last_preempt = std::max(last_preempt, record.at);
    }
  }
  ASSERT_GT(last_preempt, Time{0}) << "a held PREEMPT executed";
  for (const auto& record : records) {
    if (record.lu == 0 &&
        record.service_action == static_cast<std::uint8_t>(PrOutAction::kRegister) &&
        record.sa_key == 0) {
      EXPECT_GT(record.at, last_preempt) << "unregistered while a PREEMPT of ours could still run";
    }
  }
  const std::uint64_t holder = holder_of(0).value_or(0);
  EXPECT_EQ(holder >> 32U, (std::uint64_t{kCluster} << 16U) | kNodeA)
      << "A's held PREEMPT took LU 0";
}

// A released its key, which keeps the reservation. Its next acquire's REGISTER AND IGNORE EXISTING
// KEY on LU 0 reaches the target only after its timeout, and the READ KEYS of the read-back gets
// no answer: the read-back shows A's released key holding, and the late REGISTER then moves the
// reservation to the new key. Unregistering the new key there would drop the reservation (any
// nexus could then write, S1), and nobody else won: the acquire fails as indeterminate, leaves
// the key, and every LU keeps a reservation of A's. (Simulation seed 827273992527, --hotplug:
// the LU was left with no reservation and no key, and the next acquire's epoch went back.)
TEST_F(ResourceTest, AFailedAcquireNeverUnregistersWhereItsReleasedKeyHolds) {
  a->boot(a->options());
  const Key old_key = acquired(*a);
  Outcome* released = a->release();
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  auto registered = std::make_shared<bool>(false);
  a->faults = [registered](const FaultContext& c) {
    Fault fault;
    const auto action = static_cast<std::uint8_t>(c.command.cdb[1] & 0x1fU);
    if (c.lu == 0 && c.command.cdb[0] == 0x5f &&
        action == static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey)) {
      fault.request_delay = kCommandTimeout + milliseconds(20);
      *registered = true;
    }
    fault.drop_request = *registered && c.lu == 0 && c.command.cdb[0] == 0x5e &&
                         action == static_cast<std::uint8_t>(codec::PrInAction::kReadKeys);
    return fault;
  };
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(outcome->result->error().code(), ErrorCode::kIndeterminate)
      << outcome->result->error().message();
  EXPECT_EQ(outcome->result->error().message().find("holds it"), std::string::npos)
      << "no other node won: " << outcome->result->error().message();
  a->faults = nullptr;
  run_for(4 * kCommandTimeout + kCheckInterval);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    ASSERT_TRUE(holder_of(lu).has_value()) << "LU " << lu << " lost its reservation";
    EXPECT_EQ(Key::node_of(*holder_of(lu)), kNodeA);
    EXPECT_GE(Key::epoch_of(*holder_of(lu)), old_key.epoch());
  }
  EXPECT_FALSE(a->resource->gate_open());
}

// A's first acquire's REGISTER AND IGNORE EXISTING KEY on LU 1's second path reaches the target
// only after its timeout (the acquire fails), and A acquires again at once. Should that late
// REGISTER execute after the second acquire's verify read, it would move the nexus back to the
// first key behind the read's back, with the gate open (S2). The second acquire starts its read
// only once the transport has the late command back, so its own REGISTER comes after it and every
// registration of A carries the new key. (Simulation seed 520094538176: a cancelled acquire and a
// new one 190 ms later; primary mode's promote already waited so.)
TEST_F(ResourceTest, AnAcquireWaitsUntilAnEarlierTimedOutRegisterCanNoLongerExecute) {
  a->boot(a->options());
  auto delayed = std::make_shared<bool>(false);
  a->faults = [delayed](const FaultContext& c) {
    Fault fault;
    const auto action = static_cast<std::uint8_t>(c.command.cdb[1] & 0x1fU);
    if (!*delayed && c.lu == 1 && c.nexus % 10 == 1 && c.command.cdb[0] == 0x5f &&
        action == static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey)) {
      fault.request_delay = kCommandTimeout + milliseconds(200);
      *delayed = true;
    }
    return fault;
  };
  Outcome* first = a->acquire();
  ASSERT_TRUE(run_until([&] { return first->done(); }));
  ASSERT_FALSE(first->result->has_value());
  const Key second = acquired(*a);
  ASSERT_TRUE(a->resource->gate_open());
  run_for(kCommandTimeout + kCheckInterval);  // past the late REGISTER, whenever it ran
  const auto records = prouts_of(kNodeA);
  const auto late = std::find_if(records.begin(), records.end(), [&](const auto& record) {
    return record.lu == 1 && record.nexus % 10 == 1 && record.sa_key != second.value() &&
           record.service_action ==
               static_cast<std::uint8_t>(PrOutAction::kRegisterAndIgnoreExistingKey);
  });
  ASSERT_NE(late, records.end()) << "the first acquire's REGISTER executed";
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    for (const std::uint64_t key : keys_on(lu)) {
      EXPECT_EQ(key, second.value())
          << "LU " << lu << " has " << Key::format(key) << " beside the holder, with A's gate open";
    }
  }
}

// The same across a restart: A's acquire's REGISTER AND IGNORE EXISTING KEY on LU 1's second path
// is held at the target past its timeout, and A's daemon dies while it is held. The restarted
// daemon's transport knows nothing of it, but the epoch file says a REGISTER was under way, so the
// next acquire starts its read only once that REGISTER can no longer execute (status says why),
// and every registration of A carries the new key, with the gate open. Once nothing can execute
// any more, the monitor clears the mark, and a restart after that acquires at once.
TEST_F(ResourceTest, AnAcquireAfterARestartWaitsUntilTheRunBeforesRegisterCanNoLongerExecute) {
  a->boot(a->options());
  ASSERT_NO_FATAL_FAILURE(hold_first_register(*a, [&] { a->acquire(); }));
  ASSERT_TRUE(a->store.load("pgdata").value()->registering);
  a->crash();
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  Outcome* second = a->acquire();
  ASSERT_TRUE(run_until([&] {
    return second->done() || a->resource->detail().find("before it restarted") != std::string::npos;
  })) << a->resource->detail();
  ASSERT_FALSE(second->done()) << "the acquire did not wait for the run before's REGISTER";
  ASSERT_TRUE(run_until([&] { return second->done(); }, kCommandTimeout * 4));
  ASSERT_TRUE(second->result->has_value()) << second->result->error().message();
  const Key key = **second->result;
  ASSERT_TRUE(a->resource->gate_open());
  run_for(2 * kCommandTimeout + kCheckInterval);  // past the held REGISTER, whenever it ran
  const auto records = prouts_of(kNodeA);
  ASSERT_TRUE(std::any_of(records.begin(), records.end(), [&](const auto& record) {
    return record.lu == 1 && record.nexus % 10 == 1 && record.sa_key != key.value();
  })) << "the first acquire's REGISTER executed";
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    for (const std::uint64_t k : keys_on(lu)) {
      EXPECT_EQ(k, key.value()) << "LU " << lu << " has " << Key::format(k)
                                << " beside the holder, with A's gate open";
    }
  }
  ASSERT_TRUE(run_until([&] { return !a->store.load("pgdata").value()->registering; }))
      << "the monitor did not clear the mark";
  Outcome* released = a->release();  // so that the restart does not adopt the key
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  a->crash();
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  const Time restarted = now();
  Outcome* third = a->acquire();
  ASSERT_TRUE(run_until([&] { return third->done(); }));
  ASSERT_TRUE(third->result->has_value()) << third->result->error().message();
  EXPECT_NE(**third->result, key) << "adopted, not acquired";
  EXPECT_LT(third->at - restarted, kCommandTimeout) << "a restart with nothing under way waited";
}

// A verify read that comes back a lease after it was issued does not open the gate (it would open
// with its lease over); the acquire reads again, and gives up when every round is that slow.
TEST_F(ResourceTest, AVerifyOlderThanTheLeaseOpensNoGate) {
  ResourceOptions options = a->options();
  options.lease = milliseconds(3);
  a->boot(options);
  a->faults = [](const FaultContext& c) {
    Fault fault;
    if (c.command.cdb[0] == 0x5e) {
      fault.response_delay = milliseconds(5);  // within the command timeout, beyond the lease
    }
    return fault;
  };
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_NE(outcome->result->error().message().find("longer than the lease"), std::string::npos)
      << outcome->result->error().message();
  EXPECT_TRUE(std::none_of(a->recorder.gates.begin(), a->recorder.gates.end(),
                           [](const Recorder::Gate& g) { return g.open; }));
  a->faults = nullptr;
}

}  // namespace
}  // namespace blkfence::fence::test

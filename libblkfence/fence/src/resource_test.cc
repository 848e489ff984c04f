// Proves fence::Resource, the exclusive and shared protocols of docs/protocol.md, against the
// simulated SPC-4 target, driven the way blkfenced drives it (pump the engine, feed the time, ask
// next_wake()) on a SimClock, so nothing sleeps. Node A reaches each of three LUs through two
// nexuses (multipath), node B through one. What each test proves is said above it: acquire
// registers every path and leaves its key the holder and only registrant with a fresh, persisted
// epoch (above the persisted mark, every key seen, and a holder seen only in the reservation); a
// preempted holder closes its gate within one check_interval plus a round trip; lost contact
// fails closed after the lease and reopens only for a still-sole holder; the holder re-acquires
// under a new key; release closes the gate and leaves the key holding for the next acquirer to
// preempt; a restart adopts only its own verified, not given-up key and never touches a stale one
// (the holder preempts it); a fenced node never registers again by itself (S5); shared mode
// unfences and fences a node; a second operation is refused while one runs; and the failure paths
// (unreadable LUs, an epoch store that cannot persist, a lost REGISTER answer, keys that cannot be
// read back) open no gate, read before any further PR OUT, and leave the loser's registration to
// the winner's monitor.
#include "blkfence/fence/resource.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "blkfence/codec/cdb.h"
#include "blkfence/codec/prout.h"
#include "blkfence/endian.h"
#include "blkfence/fence/epoch_store.h"
#include "blkfence/pr/engine.h"
#include "blkfence/testing/sim_clock.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/testing/sim_transport.h"

namespace blkfence::fence {
namespace {

using codec::PrOutAction;
using std::chrono::milliseconds;
using transport::Fault;
using transport::FaultContext;
using transport::LinkState;
using transport::LuId;
using transport::NexusId;
using transport::SimClock;
using transport::SimTarget;
using transport::SimTransport;

constexpr std::uint16_t kCluster = 0x6c9d;
constexpr std::uint16_t kNodeA = 1;
constexpr std::uint16_t kNodeB = 2;
constexpr std::size_t kLus = 3;
constexpr auto kWeRo = codec::PrType::kWriteExclusiveRegistrantsOnly;
constexpr Time kCheckInterval = milliseconds(100);
constexpr Time kLease = milliseconds(400);
constexpr milliseconds kCommandTimeout{150};
constexpr Time kLatencyMax = std::chrono::microseconds(500);
// The time to run a whole operation to completion; far more than any here needs.
constexpr Time kPatience = std::chrono::seconds(5);

Key key_of(std::uint16_t node, std::uint32_t epoch) {
  return *Key::make(kCluster, node, epoch);
}

// A nexus number that says whose it is: node * 100 + LU * 10 + path.
NexusId nexus_of(std::uint16_t node, std::size_t lu, std::size_t path) {
  return static_cast<NexusId>(std::size_t{node} * 100U + lu * 10U + path);
}

std::uint16_t node_of_nexus(NexusId nexus) {
  return static_cast<std::uint16_t>(nexus / 100U);
}

transport::Command prout_command(const codec::PrOutCommand& prout) {
  transport::Command command = transport::Command::from_cdb(prout.cdb);
  command.direction = transport::DataDirection::kToDevice;
  command.data_out = prout.parameters;
  return command;
}

// One command a node put on the wire, as the transport's fault hook saw it.
struct Sent {
  Time at{0};
  NexusId nexus = 0;
  LuId lu = 0;
  std::uint8_t opcode = 0;
  std::uint8_t action = 0;  // PR IN or PR OUT service action
  std::uint64_t key = 0;    // PR OUT RESERVATION KEY
  std::uint64_t sa_key = 0;

  bool is_prout() const { return opcode == 0x5f; }
  bool is(PrOutAction a) const { return is_prout() && action == static_cast<std::uint8_t>(a); }
  // REGISTER or REGISTER AND IGNORE EXISTING KEY with a key: a registration, not an unregister.
  bool registers() const {
    return (is(PrOutAction::kRegister) || is(PrOutAction::kRegisterAndIgnoreExistingKey)) &&
           sa_key != 0;
  }
};

class Recorder final : public Observer {
 public:
  struct Gate {
    Time at{0};
    bool open = false;
    Time verified_since{0};
    std::size_t sent_before = 0;  // commands on the wire when the gate moved
  };

  Recorder(const SimClock& clock, const std::vector<Sent>& sent) : clock_(clock), sent_(sent) {}

  void on_gate(const Resource&, bool open, Time verified_since) override {
    gates.push_back(Gate{clock_.now(), open, verified_since, sent_.size()});
  }
  void on_event(const Resource&, const Event& event) override {
    events.emplace_back(clock_.now(), event);
  }

  std::size_t count(EventKind kind) const {
    return static_cast<std::size_t>(std::count_if(
        events.begin(), events.end(), [kind](const auto& e) { return e.second.kind == kind; }));
  }
  std::optional<std::pair<Time, Event>> last(EventKind kind) const {
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
      if (it->second.kind == kind) {
        return *it;
      }
    }
    return std::nullopt;
  }

  std::vector<Gate> gates;
  std::vector<std::pair<Time, Event>> events;

 private:
  const SimClock& clock_;
  const std::vector<Sent>& sent_;
};

// An epoch store whose disk is full.
class FailingStore final : public EpochStore {
 public:
  Result<std::uint32_t> load(const std::string&) override { return 0U; }
  Result<void> store(const std::string&, std::uint32_t) override {
    return fail(ErrorCode::kOs, "write RESOURCE.epoch: no space left on device");
  }
};

// An epoch store that reads what is on disk but can no longer write (its disk went read-only).
class ReadOnlyStore final : public EpochStore {
 public:
  explicit ReadOnlyStore(std::uint32_t epoch) : epoch_(epoch) {}
  Result<std::uint32_t> load(const std::string&) override { return epoch_; }
  Result<void> store(const std::string&, std::uint32_t) override {
    return fail(ErrorCode::kOs, "write RESOURCE.epoch: read-only file system");
  }

 private:
  std::uint32_t epoch_;
};

// The outcome of an operation, once its Done has run.
struct Outcome {
  std::optional<Result<Key>> result;
  Time at{0};
  bool done() const { return result.has_value(); }
};

// One simulated node: its daemon (transport, engine, resource) can crash and boot again; its
// epoch store (its disk) and its observer outlive that.
class Node {
 public:
  Node(SimTarget& target, std::vector<Sent>& sent, std::uint16_t id, std::size_t paths)
      : recorder(target.clock(), sent), target_(target), sent_(sent), id_(id) {
    for (std::size_t lu = 0; lu < kLus; ++lu) {
      pr::LogicalUnit unit{
          .wwn = "naa.sim" + std::to_string(lu), .name = "lu" + std::to_string(lu), .paths = {}};
      for (std::size_t p = 0; p < paths; ++p) {
        const std::string device =
            "/dev/sg-n" + std::to_string(id) + "-" + std::to_string(lu) + "-" + std::to_string(p);
        target.add_path(device, static_cast<LuId>(lu), nexus_of(id, lu, p));
        unit.paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device});
      }
      lus_.push_back(std::move(unit));
    }
  }

  ResourceOptions options(Mode mode = Mode::kExclusive, bool preempt_abort = false) const {
    ResourceOptions o;
    o.name = "pgdata";
    o.lus = lus_;
    o.mode = mode;
    o.type = kWeRo;
    o.preempt_abort = preempt_abort;
    o.cluster_id = kCluster;
    o.node_id = id_;
    o.check_interval = kCheckInterval;
    o.lease = kLease;
    return o;
  }

  // Starts the daemon: a fresh transport, engine and resource over the same store.
  void boot(ResourceOptions o, EpochStore* epochs = nullptr) {
    auto made = SimTransport::make(
        target_, {.seed = 1000U + id_ + boots_,
                  .latency_min = std::chrono::microseconds(100),
                  .latency_max = kLatencyMax,
                  .deadline_grace = milliseconds(0),
                  .fault = [this](const FaultContext& c) { return on_command(c); }});
    ASSERT_TRUE(made.has_value());
    transport = std::move(*made);
    pr::RetryPolicy policy;
    policy.command_timeout = kCommandTimeout;
    engine = std::make_unique<pr::Engine>(*transport, policy);
    resource =
        std::make_unique<Resource>(std::move(o), *engine, epochs ? *epochs : store, recorder);
    ++boots_;
  }
  // The daemon dies: nothing of it runs again; its commands in flight may still execute.
  void crash() {
    resource.reset();
    engine.reset();
    transport.reset();
  }

  Outcome* acquire() {
    return track([&](auto done) { resource->acquire(now(), done); });
  }
  Outcome* release() {
    return track([&](auto done) { resource->release(now(), done); });
  }
  Outcome* unfence() {
    return track([&](auto done) { resource->unfence(now(), done); });
  }
  Outcome* fence_node(std::uint16_t victim) {
    return track([&](auto done) { resource->fence_node(victim, now(), done); });
  }

  // Commands of this node on the wire from index `from` on.
  std::vector<Sent> sent_since(std::size_t from) const {
    std::vector<Sent> mine;
    for (std::size_t i = from; i < sent_.size(); ++i) {
      if (node_of_nexus(sent_[i].nexus) == id_) {
        mine.push_back(sent_[i]);
      }
    }
    return mine;
  }

  Time now() const { return target_.clock().now(); }
  std::uint16_t id() const { return id_; }

  std::function<Fault(const FaultContext&)> faults;  // injected into this node's commands
  MemoryEpochStore store;
  Recorder recorder;
  std::unique_ptr<SimTransport> transport;
  std::unique_ptr<pr::Engine> engine;
  std::unique_ptr<Resource> resource;

 private:
  Fault on_command(const FaultContext& c) {
    Sent sent{.at = c.now,
              .nexus = c.nexus,
              .lu = c.lu,
              .opcode = c.command.cdb[0],
              .action = static_cast<std::uint8_t>(c.command.cdb[1] & 0x1fU),
              .key = 0,
              .sa_key = 0};
    if (sent.is_prout() && c.command.data_out.size() >= 16) {
      sent.key = load_be64(c.command.data_out, 0);
      sent.sa_key = load_be64(c.command.data_out, 8);
    }
    sent_.push_back(sent);
    return faults ? faults(c) : Fault{};
  }

  template <class Start>
  Outcome* track(Start start) {
    outcomes_.push_back(std::make_unique<Outcome>());
    Outcome* outcome = outcomes_.back().get();
    start([outcome](Result<Key> result, Time at) {
      outcome->result = std::move(result);
      outcome->at = at;
    });
    return outcome;
  }

  SimTarget& target_;
  std::vector<Sent>& sent_;
  std::uint16_t id_;
  std::uint64_t boots_ = 0;
  std::vector<pr::LogicalUnit> lus_;
  std::vector<std::unique_ptr<Outcome>> outcomes_;
};

class ResourceTest : public ::testing::Test {
 protected:
  ResourceTest() {
    for (std::size_t lu = 0; lu < kLus; ++lu) {
      target.add_lu();
    }
    a = std::make_unique<Node>(target, sent, kNodeA, 2);
    b = std::make_unique<Node>(target, sent, kNodeB, 1);
  }

  Time now() const { return clock.now(); }

  // One step of the driver loop: to the next moment anything is due (a simulated event, an
  // engine retry, a resource check or lease), at most limit; then every live daemon reaps and
  // sees the time, as blkfenced's event loop does.
  void step(Time limit) {
    Time next = limit;
    if (const auto event = clock.next_event()) {
      next = std::min(next, *event);
    }
    for (Node* node : {a.get(), b.get()}) {
      if (!node->resource) {
        continue;
      }
      for (const auto wake : {node->engine->next_wake(), node->resource->next_wake()}) {
        if (wake) {
          next = std::min(next, std::max(*wake, now()));
        }
      }
    }
    clock.advance_to(std::max(next, now()));
    for (Node* node : {a.get(), b.get()}) {
      if (node->resource) {
        ASSERT_TRUE(node->engine->pump(now()).has_value());
        node->resource->on_time(now());
      }
    }
  }

  void run_for(Time duration) {
    const Time end = now() + duration;
    for (int i = 0; now() < end && i < 1'000'000; ++i) {
      step(end);
    }
  }

  bool run_until(const std::function<bool()>& done, Time patience = kPatience) {
    const Time end = now() + patience;
    for (int i = 0; !done() && now() < end && i < 1'000'000; ++i) {
      step(end);
    }
    return done();
  }

  Key acquired(Node& node) {
    Outcome* outcome = node.acquire();
    EXPECT_TRUE(run_until([outcome] { return outcome->done(); }));
    EXPECT_TRUE(outcome->result.has_value() && outcome->result->has_value())
        << (outcome->done() && !outcome->result->has_value() ? outcome->result->error().message()
                                                             : std::string("not done"));
    return outcome->done() && outcome->result->has_value() ? **outcome->result : key_of(1, 0);
  }

  std::vector<std::uint64_t> keys_on(std::size_t lu) const {
    std::vector<std::uint64_t> keys;
    for (const auto& registration : target.registrations(static_cast<LuId>(lu))) {
      keys.push_back(registration.key);
    }
    std::sort(keys.begin(), keys.end());
    return keys;
  }
  std::optional<std::uint64_t> holder_of(std::size_t lu) const {
    const auto reservation = target.reservation(static_cast<LuId>(lu));
    return reservation ? std::optional(reservation->key) : std::nullopt;
  }
  // Sets a registration behind the protocol's back, as another initiator (or a late command) would.
  // A pending unit attention stops the first try, as it would the real command.
  void register_directly(NexusId nexus, std::size_t lu, std::uint64_t key) {
    std::uint8_t status = 0xff;
    for (int attempt = 0; attempt < 3 && status != 0; ++attempt) {
      status = target
                   .execute(static_cast<LuId>(lu), nexus,
                            prout_command(codec::prout_register_and_ignore(key)))
                   .status;
    }
    ASSERT_EQ(status, 0);
  }
  // Any PR OUT behind the protocol's back (a unit attention stops the first try, as above).
  void prout_directly(NexusId nexus, LuId lu, const codec::PrOutCommand& prout) {
    std::uint8_t status = 0xff;
    for (int attempt = 0; attempt < 3 && status != 0; ++attempt) {
      status = target.execute(lu, nexus, prout_command(prout)).status;
    }
    ASSERT_EQ(status, 0);
  }
  // The PR OUT records of the target, by a node's nexuses, in the order they executed.
  std::vector<transport::PrOutRecord> prouts_of(std::uint16_t node) const {
    std::vector<transport::PrOutRecord> records;
    for (const auto& record : target.history().prouts) {
      if (node_of_nexus(record.nexus) == node) {
        records.push_back(record);
      }
    }
    return records;
  }

  SimClock clock;
  SimTarget target{clock};
  std::vector<Sent> sent;
  std::unique_ptr<Node> a;
  std::unique_ptr<Node> b;
};

// Acquire on three LUs, each reached through two nexuses: REGISTER AND IGNORE goes to every path,
// the key ends as the holder and the only registrant (B's key, seen on one LU, is preempted), the
// epoch is one above the highest this cluster shows on any LU (9, above the persisted 7), it is
// persisted, and the gate opens with a verified_since no later than the moment it opened.
TEST_F(ResourceTest, AcquireRegistersEveryPathAndHoldsAloneWithAFreshPersistedEpoch) {
  ASSERT_TRUE(a->store.store("pgdata", 7).has_value());
  register_directly(nexus_of(kNodeB, 1, 0), 1, key_of(kNodeB, 9).value());
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_FALSE(a->resource->gate_open());

  const std::size_t before = sent.size();
  const Key key = acquired(*a);
  EXPECT_EQ(key, key_of(kNodeA, 10));
  EXPECT_EQ(a->store.load("pgdata").value_or(0), 10U);
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
  ASSERT_TRUE(a->store.store("pgdata", 12).has_value());
  register_directly(nexus_of(kNodeB, 0, 0), 0, key_of(kNodeB, 9).value());
  a->boot(a->options());
  const Key key = acquired(*a);
  EXPECT_EQ(key.epoch(), 13U);
  EXPECT_EQ(a->store.load("pgdata").value_or(0), 13U);
  EXPECT_EQ(acquired(*a), key) << "acquire while holding is a no-op";
  EXPECT_EQ(a->store.load("pgdata").value_or(0), 13U);
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
  // A read already in flight must time out first; the next check then sees the key.
  EXPECT_LE(now() - back, kCheckInterval + kCommandTimeout + 4 * kLatencyMax);
  EXPECT_GE(a->recorder.gates.back().verified_since, back);
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_EQ(a->resource->key(), key);
  EXPECT_EQ(a->recorder.count(EventKind::kContactRestored), 1U);
}

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

// Release closes the gate and sends nothing: the key keeps the reservation (an LU without one would
// let a node preempted a moment ago write again, S1), the store moves one past the epoch so that a
// restart does not adopt it, and the next acquirer preempts it like any holder, with a higher
// epoch (the LUs still show the released one, S3).
TEST_F(ResourceTest, ReleaseClosesTheGateAndLeavesTheKeyHoldingForTheNextAcquirer) {
  a->boot(a->options());
  b->boot(b->options());
  const Key key = acquired(*a);
  const std::size_t before = sent.size();
  Outcome* released = a->release();
  EXPECT_FALSE(a->resource->gate_open()) << "closed synchronously";
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  ASSERT_TRUE(released->result->has_value()) << released->result->error().message();
  EXPECT_EQ(**released->result, key);
  run_for(milliseconds(500));  // monitor rounds: still nothing
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), key.value()) << "LU " << lu;
  }
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_FALSE(a->resource->key().has_value());
  EXPECT_EQ(a->recorder.count(EventKind::kReleased), 1U);
  EXPECT_EQ(a->store.load("pgdata").value_or(0), key.epoch() + 1);

  // A restart finds its own key as the only holder and does not adopt it.
  a->crash();
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  run_for(milliseconds(300));
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_NE(a->resource->detail().find("not the current token"), std::string::npos)
      << a->resource->detail();

  const Key key_b = acquired(*b);
  EXPECT_GT(key_b.epoch(), key.epoch());
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(keys_on(lu), (std::vector<std::uint64_t>{key_b.value()})) << "LU " << lu;
  }
  // And A acquires again above both.
  const Key again = acquired(*a);
  EXPECT_GT(again.epoch(), key_b.epoch());
}

// A release that cannot store the epoch says so: the gate is closed, but a restart would adopt the
// key again.
TEST_F(ResourceTest, ReleaseReportsAnEpochStoreThatCannotPersist) {
  a->boot(a->options());
  const Key key = acquired(*a);
  ReadOnlyStore read_only(key.epoch());
  a->crash();
  a->boot(a->options(), &read_only);
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open(); })) << "adopted";
  Outcome* released = a->release();
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  EXPECT_FALSE(a->resource->gate_open());
  ASSERT_FALSE(released->result->has_value());
  EXPECT_EQ(released->result->error().code(), ErrorCode::kOs);
  EXPECT_NE(released->result->error().message().find("a restart would adopt"), std::string::npos)
      << released->result->error().message();
  EXPECT_EQ(holder_of(0), key.value());
}

// A restarted daemon that finds its own key verified as the holder and only registrant adopts it:
// the gate opens with the same key and not one PR OUT is sent.
TEST_F(ResourceTest, RestartAdoptsItsOwnVerifiedKeyWithoutAPrOut) {
  a->boot(a->options());
  const Key key = acquired(*a);
  a->crash();
  run_for(milliseconds(50));
  const std::size_t before = sent.size();
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open(); }));
  EXPECT_EQ(a->resource->key(), key);
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_EQ(a->recorder.count(EventKind::kAcquired), 2U);
  run_for(milliseconds(500));
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->store.load("pgdata").value_or(0), key.epoch());
}

// A restarted daemon that finds a stale key of its own (registered on one nexus, while another
// node holds) leaves it alone (S5): gate closed, no PR OUT; and its next acquire still draws an
// epoch above it (S3).
TEST_F(ResourceTest, RestartLeavesAStaleKeyOfItsOwnAlone) {
  a->boot(a->options());
  b->boot(b->options());
  const Key old_key = acquired(*a);
  const Key key_b = acquired(*b);
  register_directly(nexus_of(kNodeA, 0, 1), 0, old_key.value());  // a late REGISTER executes
  a->crash();
  const std::size_t before = sent.size();
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  run_for(milliseconds(500));
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_NE(a->resource->detail().find("left as it is"), std::string::npos)
      << a->resource->detail();
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  EXPECT_GE(a->resource->epoch_high_water(), old_key.epoch());
  // It is B, the holder, that removes it: a key of its cluster ranking below its own.
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key_b.value()}));
  EXPECT_GE(b->resource->counters().strays_preempted, 1U);
  EXPECT_TRUE(b->resource->gate_open());

  const Key key = acquired(*a);
  EXPECT_GT(key.epoch(), key_b.epoch());
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value()}));
}

// The holder's PREEMPTs of a stray key (one of its cluster, ranking below its own), as sent.
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

// A node whose stray registration comes back each time it is preempted (it re-registers by itself,
// breaking S5) is preempted after 2, 4, 8, ... check intervals, not at every round: the holder does
// not drive a preempt/re-register cycle at the monitor's rate. A node that then stays away for its
// whole window is forgotten, and its next stray is preempted one interval after it is seen.
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
  ASSERT_GE(preempts.size(), 5U);
  EXPECT_LE(preempts.size(), 7U) << "70 intervals hold 1 + 2 + 4 + 8 + 16 + 32 and no more";
  for (std::size_t i = 1; i < preempts.size(); ++i) {
    const int shift = std::min<int>(static_cast<int>(i), 6);
    EXPECT_GE(preempts[i].at - preempts[i - 1].at, kCheckInterval * (1 << shift))
        << "gap after preempt " << i;
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
  EXPECT_GT(a->store.load("pgdata").value_or(0), key_b.epoch() + 1)
      << "one past A's given-up epoch, itself above B's";
  a->faults = nullptr;
}

// Where a PREEMPT of a failed acquire timed out, the key is not unregistered at once: had the
// PREEMPT executed first, the unregister would drop the reservation (S1). Here every PREEMPT of
// A's on LU 0 is lost on the way, so the acquire gives up with B holding LU 0 and A holding the
// others: A's key stays registered on LU 0 until the late-execution horizon has passed, then A's
// monitor unregisters it there; on LUs 1 and 2 it keeps the reservation, gate closed.
TEST_F(ResourceTest, AFailedAcquireUnregistersLateWhereItsPreemptTimedOut) {
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
  EXPECT_NE(outcome->result->error().message().find("stays registered on lu0"), std::string::npos)
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
  EXPECT_GE(first->at - failed_at, 2 * kCommandTimeout) << "not before the horizon";
  EXPECT_EQ(first->lu, 0U);
  for (std::size_t lu = 1; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), key_a) << "LU " << lu << " keeps its reservation";
  }
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kReleased);
}

// Path hot-plug: a new path of a LU this node holds is registered with the current key, after a
// read, and the key stays the verified holder; a path that went away is dropped from the LU.
TEST_F(ResourceTest, ANewPathOfAHeldLuIsRegisteredWithTheCurrentKey) {
  a->boot(a->options());
  const Key key = acquired(*a);
  const std::string device = "/dev/sg-n1-0-new";
  const NexusId nexus = nexus_of(kNodeA, 0, 5);
  target.add_path(device, 0, nexus);
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.erase(paths.begin());  // the first path went away
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device});
  const std::size_t before = sent.size();
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  const auto mine = a->sent_since(before);
  const auto registrations = std::count_if(mine.begin(), mine.end(), [&](const Sent& s) {
    return s.registers() && s.sa_key == key.value();
  });
  EXPECT_EQ(registrations, 1);
  const auto first_register =
      std::find_if(mine.begin(), mine.end(), [](const Sent& s) { return s.registers(); });
  ASSERT_NE(first_register, mine.end());
  EXPECT_EQ(first_register->nexus, nexus);
  EXPECT_TRUE(std::any_of(mine.begin(), first_register, [](const Sent& s) {
    return s.opcode == 0x5e;
  })) << "read before registering";
  // Two of A's nexuses were registered before; the new one adds a third registration.
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value(), key.value()}));
  EXPECT_EQ(a->resource->options().lus[0].paths.size(), 2U);
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_GE(a->recorder.count(EventKind::kPathsChanged), 2U);  // the change, then the registration
}

// S5 for paths: after a fence, a new path (or one that comes back) is not registered; not one
// PR OUT is sent.
TEST_F(ResourceTest, ANewPathAfterAFenceIsNotRegistered) {
  a->boot(a->options());
  b->boot(b->options());
  acquired(*a);
  const Key key_b = acquired(*b);
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  const std::string device = "/dev/sg-n1-0-new";
  target.add_path(device, 0, nexus_of(kNodeA, 0, 5));
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device});
  const std::size_t before = sent.size();
  a->resource->update_paths(0, paths, now());
  run_for(kCheckInterval * 5);
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key_b.value()}));
  EXPECT_EQ(a->resource->options().lus[0].paths.size(), 3U);
  const auto changed = a->recorder.last(EventKind::kPathsChanged);
  ASSERT_TRUE(changed.has_value());
  EXPECT_NE(changed->second.detail.find("not registered"), std::string::npos)
      << changed->second.detail;
}

// Preempted between the read and the REGISTER of a new path: the read afterwards sees it, the new
// path's registration is taken back, and the monitor declares the fence at once.
TEST_F(ResourceTest, ANewPathRegisteredJustAfterAPreemptIsTakenBack) {
  a->boot(a->options());
  const Key key_a = acquired(*a);
  const std::string device = "/dev/sg-n1-0-new";
  const NexusId nexus = nexus_of(kNodeA, 0, 5);
  target.add_path(device, 0, nexus);
  // B preempts A the moment A's REGISTER of the new path is on the wire.
  bool preempted = false;
  a->faults = [&](const FaultContext& c) {
    if (c.nexus == nexus && c.command.cdb[0] == 0x5f && !preempted) {
      preempted = true;
      const Key key_b = key_of(kNodeB, key_a.epoch() + 1);
      for (std::size_t lu = 0; lu < kLus; ++lu) {
        register_directly(nexus_of(kNodeB, lu, 0), static_cast<LuId>(lu), key_b.value());
        prout_directly(nexus_of(kNodeB, lu, 0), static_cast<LuId>(lu),
                       codec::prout_preempt(key_b.value(), key_a.value(), kWeRo));
      }
    }
    return Fault{};
  };
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device});
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kFenced; }));
  ASSERT_TRUE(preempted);
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_FALSE(a->resource->gate_open());
  const auto keys = keys_on(0);
  EXPECT_TRUE(std::none_of(keys.begin(), keys.end(), [&](std::uint64_t k) {
    return k == key_a.value();
  })) << "the new path's registration was taken back";
  a->faults = nullptr;
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

// A release asked for while a new path is being registered closes the gate at once and is done
// right after the registration, instead of failing as busy (Patroni's on_stop must not fail).
TEST_F(ResourceTest, AReleaseDuringANewPathRegistrationWaitsForItInsteadOfFailing) {
  a->boot(a->options());
  const Key key = acquired(*a);
  const std::string device = "/dev/sg-n1-0-new";
  target.add_path(device, 0, nexus_of(kNodeA, 0, 5));
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device});
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(a->resource->busy()) << "the registration runs";
  Outcome* released = a->release();
  EXPECT_FALSE(a->resource->gate_open()) << "closed at once";
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  ASSERT_TRUE(released->result->has_value()) << released->result->error().message();
  EXPECT_EQ(**released->result, key);
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value(), key.value()}))
      << "the new path was registered first";
}

}  // namespace
}  // namespace blkfence::fence

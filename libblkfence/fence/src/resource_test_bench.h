// The test bench of fence::Resource's unit tests (resource_*_test.cc): two simulated nodes and a
// simulated SPC-4 target on a SimClock, driven the way blkfenced drives a resource (pump the
// engine, feed the time, ask next_wake()), so nothing sleeps. Node A reaches each of three LUs
// through two nexuses (multipath), node B through one. Test-only.
#pragma once

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
#include "blkfence/fence/resource.h"
#include "blkfence/pr/engine.h"
#include "blkfence/testing/sim_clock.h"
#include "blkfence/testing/sim_target.h"
#include "blkfence/testing/sim_transport.h"

namespace blkfence::fence::test {

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
constexpr auto kWeAr = codec::PrType::kWriteExclusiveAllRegistrants;
constexpr Time kCheckInterval = milliseconds(100);
constexpr Time kLease = milliseconds(400);
constexpr milliseconds kCommandTimeout{150};
constexpr Time kLatencyMax = std::chrono::microseconds(500);
// The time to run a whole operation to completion; far more than any here needs.
constexpr Time kPatience = std::chrono::seconds(5);

inline Key key_of(std::uint16_t node, std::uint32_t epoch) {
  return *Key::make(kCluster, node, epoch);
}

// A nexus number that says whose it is: node * 100 + LU * 10 + path.
inline NexusId nexus_of(std::uint16_t node, std::size_t lu, std::size_t path) {
  return static_cast<NexusId>(std::size_t{node} * 100U + lu * 10U + path);
}

inline std::uint16_t node_of_nexus(NexusId nexus) {
  return static_cast<std::uint16_t>(nexus / 100U);
}

inline transport::Command prout_command(const codec::PrOutCommand& prout) {
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
  bool aptpl = false;  // PR OUT parameter list byte 20 bit 0

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
  Result<std::optional<StoredEpochs>> load(const std::string&) override { return StoredEpochs{}; }
  Result<void> store(const std::string&, StoredEpochs) override {
    return fail(ErrorCode::kOs, "write RESOURCE.epoch: no space left on device");
  }
  std::string where(const std::string& resource) const override { return resource + ".epoch"; }
};

// An epoch store that reads what is on disk but can no longer write (its disk went read-only).
class ReadOnlyStore final : public EpochStore {
 public:
  explicit ReadOnlyStore(std::uint32_t epoch) : epoch_(epoch) {}
  Result<std::optional<StoredEpochs>> load(const std::string&) override {
    return StoredEpochs{.used = epoch_, .seen = epoch_};
  }
  Result<void> store(const std::string&, StoredEpochs) override {
    return fail(ErrorCode::kOs, "write RESOURCE.epoch: read-only file system");
  }
  std::string where(const std::string& resource) const override { return resource + ".epoch"; }

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
        unit.paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
      }
      lus_.push_back(std::move(unit));
    }
  }

  ResourceOptions options(Mode mode = Mode::kExclusive, bool preempt_abort = false) const {
    ResourceOptions o;
    o.name = "pgdata";
    o.lus = lus_;
    o.mode = mode;
    o.type = mode == Mode::kShared ? kWeAr : kWeRo;  // primary mode: set primary and kWeRo
    o.preempt_abort = preempt_abort;
    o.cluster_id = kCluster;
    o.node_id = id_;
    o.check_interval = kCheckInterval;
    o.lease = kLease;
    // The node's writes in flight: those the target holds from its nexuses (the tests submit
    // writes to the target directly).
    o.writes_in_flight = [this](const pr::LogicalUnit& unit) -> Result<std::uint64_t> {
      const std::size_t lu = std::stoul(unit.name.substr(2));
      std::uint64_t writes = 0;
      for (std::size_t p = 0; p < unit.paths.size(); ++p) {
        writes += target_.held_count(static_cast<LuId>(lu), nexus_of(id_, lu, p));
      }
      return writes;
    };
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
  Outcome* promote() {
    return track([&](auto done) { resource->promote(now(), done); });
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
  // The epoch this node last used, on its disk; 0 when there is none.
  std::uint32_t stored_epoch() {
    const auto stored = store.load("pgdata");
    return stored && *stored ? (*stored)->used : 0U;
  }
  // The highest epoch it has seen; 0 when there is none.
  std::uint32_t seen_epoch() {
    const auto stored = store.load("pgdata");
    return stored && *stored ? (*stored)->seen : 0U;
  }

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
              .sa_key = 0,
              .aptpl = false};
    if (sent.is_prout() && c.command.data_out.size() >= 16) {
      sent.key = load_be64(c.command.data_out, 0);
      sent.sa_key = load_be64(c.command.data_out, 8);
      sent.aptpl = c.command.data_out.size() > 20 && (c.command.data_out[20] & 0x01U) != 0;
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
  // Holds node's first REGISTER AND IGNORE EXISTING KEY on LU 1's second path at the target past
  // its timeout, and waits until it is held there: it executes late, whatever becomes of the
  // daemon that sent it (a restart's case). start: what sends it.
  void hold_first_register(Node& node, const std::function<void()>& start) {
    auto held = std::make_shared<bool>(false);
    node.faults = [held](const FaultContext& c) {
      Fault fault;
      const auto action = static_cast<std::uint8_t>(c.command.cdb[1] & 0x1fU);
      if (!*held && c.lu == 1 && c.nexus % 10 == 1 && c.command.cdb[0] == 0x5f &&
          action == static_cast<std::uint8_t>(codec::PrOutAction::kRegisterAndIgnoreExistingKey)) {
        fault.execute_delay = kCommandTimeout + milliseconds(200);
        *held = true;
      }
      return fault;
    };
    start();
    ASSERT_TRUE(run_until([&] { return target.held_count(1, nexus_of(node.id(), 1, 1)) > 0; }));
  }
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

}  // namespace blkfence::fence::test

// Proves fence::Resource's start and release (docs/protocol.md, "Start" and "Release") on the
// bench of resource_test_bench.h: release closes the gate and leaves the key holding for the next
// acquirer to preempt, and reports an epoch store that cannot persist; a restart adopts only its
// own verified, not given-up key without a PR OUT, and never touches a stale one (the holder
// preempts it).
#include <gtest/gtest.h>

#include "resource_test_bench.h"

namespace blkfence::fence::test {
namespace {

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
  EXPECT_EQ(a->stored_epoch(), key.epoch() + 1);

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
  EXPECT_EQ(a->stored_epoch(), key.epoch());
}

// docs/protocol.md, "Identical keys": the options of node, with each path's initiator port as
// discovery reads it from sysfs on iSCSI and Fibre Channel.
ResourceOptions with_ports(const Node& node) {
  ResourceOptions options = node.options();
  for (std::size_t lu = 0; lu < options.lus.size(); ++lu) {
    for (std::size_t p = 0; p < options.lus[lu].paths.size(); ++p) {
      options.lus[lu].paths[p].initiator = SimTarget::initiator_port(nexus_of(node.id(), lu, p));
    }
  }
  return options;
}

// A key with this node's node_id registered through a port that is none of this node's (a second
// node configured with node_id 1) would be taken for a stale key of its own: an acquire refuses
// before it sends anything, and a daemon started meanwhile neither adopts nor releases; once the
// key is gone, both go on, and this node's own registrations never count as another's.
TEST_F(ResourceTest, AKeyOfThisNodeRegisteredThroughAnotherPortIsRefused) {
  const std::uint64_t twin = key_of(kNodeA, 7).value();
  const NexusId elsewhere = nexus_of(kNodeB, 1, 0);
  register_directly(elsewhere, 1, twin);
  a->boot(with_ports(*a));
  const std::size_t before = sent.size();
  Outcome* refused = a->acquire();
  ASSERT_TRUE(run_until([&] { return refused->done(); }));
  ASSERT_FALSE(refused->result->has_value());
  const Error& error = refused->result->error();
  EXPECT_EQ(error.code(), ErrorCode::kKeyInUse);
  for (const std::string& part :
       {Key::format(twin), std::string("lu1"),
        codec::to_string(SimTarget::initiator_port(elsewhere)), std::string("node_id 1")}) {
    EXPECT_NE(error.message().find(part), std::string::npos) << part << " in " << error.message();
  }
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_EQ(keys_on(1), std::vector<std::uint64_t>{twin});

  a->crash();
  a->boot(with_ports(*a));
  a->resource->start(now());
  run_for(4 * kCheckInterval);
  EXPECT_EQ(a->resource->state(), State::kUnknown);
  EXPECT_NE(a->resource->detail().find("none of this node's"), std::string::npos)
      << a->resource->detail();

  register_directly(elsewhere, 1, 0);  // the other node unregisters
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kReleased; }))
      << "the monitor's next probe decides";
  const Key key = acquired(*a);
  EXPECT_TRUE(a->resource->gate_open());
  a->crash();
  a->boot(with_ports(*a));
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open(); }))
      << "its own two paths' registrations are its own: " << a->resource->detail();
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_EQ(keys_on(1), (std::vector<std::uint64_t>{key.value(), key.value()}));
}

// A READ FULL STATUS that does not come back proves nothing about whose keys are on the LUs: the
// read fails, as it would for READ KEYS, and the acquire with it, before it sends anything.
TEST_F(ResourceTest, AFullStatusThatDoesNotComeBackFailsTheRead) {
  a->faults = [](const FaultContext& c) {
    Fault fault;
    if (c.command.cdb[0] == 0x5e && (c.command.cdb[1] & 0x1fU) == 0x03) {
      fault.os_errno = EIO;
    }
    return fault;
  };
  a->boot(with_ports(*a));
  const std::size_t before = sent.size();
  Outcome* failed = a->acquire();
  ASSERT_TRUE(run_until([&] { return failed->done(); }));
  ASSERT_FALSE(failed->result->has_value());
  EXPECT_NE(failed->result->error().message().find("cannot read the LUs"), std::string::npos)
      << failed->result->error().message();
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  a->faults = nullptr;
  acquired(*a);
  EXPECT_TRUE(a->resource->gate_open());
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

}  // namespace
}  // namespace blkfence::fence::test

// Proves how fence::Resource keeps its epochs on the node's disk (S3, docs/protocol.md) on the
// bench of resource_test_bench.h, with the real file store in a temporary directory: an acquire,
// promote or unfence whose epoch cannot be stored (full disk, failing fsync of the file or the
// directory, read-only directory) fails before registering its new key anywhere, and leaves the old
// file.
#include <algorithm>
#include <cerrno>
#include <memory>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "epoch_faults.h"
#include "resource_test_bench.h"

namespace blkfence::fence::test {
namespace {

enum class StoreFault { kFullDisk, kFsyncFile, kReadOnlyDir, kFsyncDir };
enum class Operation { kAcquire, kPromote, kUnfence };

std::string name_of(StoreFault fault) {
  switch (fault) {
    case StoreFault::kFullDisk: return "FullDisk";
    case StoreFault::kFsyncFile: return "FsyncFileEio";
    case StoreFault::kReadOnlyDir: return "ReadOnlyDir";
    case StoreFault::kFsyncDir: return "FsyncDirEio";
  }
  return "?";
}

std::string name_of(Operation operation) {
  switch (operation) {
    case Operation::kAcquire: return "Acquire";
    case Operation::kPromote: return "Promote";
    case Operation::kUnfence: return "Unfence";
  }
  return "?";
}

class EpochsTest : public ResourceTest {
 protected:
  EpochsTest()
      : faults(std::make_shared<EpochFaults>()),
        file_store(make_file_epoch_store(dir.path(), faulty_calls(faults))) {}

  ResourceOptions options_for(Node& node, Operation operation) const {
    if (operation == Operation::kAcquire) {
      return node.options();
    }
    ResourceOptions o = node.options(Mode::kShared);
    o.primary = true;  // a member draws an epoch in primary mode (docs/protocol.md)
    o.type = kWeRo;
    return o;
  }

  std::string path() const { return dir.file("pgdata.epoch"); }

  // The target forgets every registration (a CLEAR by B's nexus; a power cycle without APTPL is
  // the same to the protocol).
  void clear_every_lu(Key key_b) {
    for (std::size_t lu = 0; lu < kLus; ++lu) {
      prout_directly(nexus_of(kNodeB, lu, 0), static_cast<LuId>(lu),
                     codec::prout_clear(key_b.value()));
    }
  }

  // READ RESERVATION gets no answer; READ KEYS does.
  static Fault read_reservation_fails(const FaultContext& c) {
    Fault fault;
    fault.transport_error = c.command.cdb[0] == 0x5e && (c.command.cdb[1] & 0x1f) == 0x01;
    return fault;
  }

  TempDir dir;
  std::shared_ptr<EpochFaults> faults;
  std::unique_ptr<EpochStore> file_store;
};

class StoreFaultTest : public EpochsTest,
                       public ::testing::WithParamInterface<std::tuple<Operation, StoreFault>> {};

// S3: the epoch is durable before the key exists anywhere. B holds (or is the primary) with epoch
// 1; A's operation reads it, draws 2, cannot store it, and fails: no REGISTER of A's new key was
// sent, no key of A's above the old one is on any LU, and the file still holds what it held (the
// directory's fsync fails after the rename, so there the file may hold the unused epoch instead).
TEST_P(StoreFaultTest, AnEpochThatCannotBeStoredIsNeverRegistered) {
  const auto [operation, fault] = GetParam();
  b->boot(options_for(*b, operation));
  a->boot(options_for(*a, operation), file_store.get());
  ASSERT_TRUE(file_store->store("pgdata", {.used = 1, .seen = 1}).has_value());
  std::uint32_t member_epoch = 0;
  if (operation == Operation::kAcquire) {
    (void)acquired(*b);
  } else {
    Outcome* member = b->unfence();
    ASSERT_TRUE(run_until([&] { return member->done(); }));
    ASSERT_TRUE(member->result->has_value());
    if (operation == Operation::kPromote) {
      Outcome* joined = a->unfence();
      ASSERT_TRUE(run_until([&] { return joined->done(); }));
      ASSERT_TRUE(joined->result->has_value()) << joined->result->error().message();
      member_epoch = (*joined->result)->epoch();
    }
  }
  const std::optional<std::string> before_file = slurp(path());
  ASSERT_TRUE(before_file.has_value());
  switch (fault) {
    case StoreFault::kFullDisk: faults->write = ENOSPC; break;
    case StoreFault::kFsyncFile: faults->fsync_file = EIO; break;
    case StoreFault::kReadOnlyDir: faults->create = EROFS; break;
    case StoreFault::kFsyncDir: faults->fsync_dir = EIO; break;
  }
  const std::size_t before = sent.size();
  Outcome* outcome = operation == Operation::kAcquire   ? a->acquire()
                     : operation == Operation::kPromote ? a->promote()
                                                        : a->unfence();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(outcome->result->error().code(), ErrorCode::kOs);
  EXPECT_NE(outcome->result->error().message().find(dir.path()), std::string::npos)
      << outcome->result->error().message();
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.registers(); }))
      << "a REGISTER of a key whose epoch is not on disk";
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    for (const std::uint64_t k : keys_on(lu)) {
      EXPECT_FALSE(Key::node_of(k) == kNodeA && Key::epoch_of(k) > member_epoch)
          << Key::format(k) << " on lu" << lu;
    }
  }
  EXPECT_FALSE(a->resource->gate_open() && operation != Operation::kPromote);
  if (fault != StoreFault::kFsyncDir) {
    EXPECT_EQ(slurp(path()), before_file);
  }
  EXPECT_EQ(slurp(path() + ".new"), std::nullopt);
  a->crash();  // before the store goes
}

INSTANTIATE_TEST_SUITE_P(
    EveryPersistencePath, StoreFaultTest,
    ::testing::Combine(::testing::Values(Operation::kAcquire, Operation::kPromote,
                                         Operation::kUnfence),
                       ::testing::Values(StoreFault::kFullDisk, StoreFault::kFsyncFile,
                                         StoreFault::kReadOnlyDir, StoreFault::kFsyncDir)),
    [](const auto& param_info) {
      return name_of(std::get<0>(param_info.param)) + name_of(std::get<1>(param_info.param));
    });

// A garbage epoch file stops the start and every operation with a message naming it: the node does
// not know which epochs it used.
TEST_F(EpochsTest, AGarbageFileStopsStartAndAcquireNamingIt) {
  write_file(path(), "1x\n");
  a->boot(a->options(), file_store.get());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kUnknown);
  EXPECT_NE(a->resource->detail().find(path()), std::string::npos) << a->resource->detail();
  const std::size_t before = sent.size();
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_NE(outcome->result->error().message().find(path()), std::string::npos);
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  EXPECT_EQ(slurp(path()), "1x\n");
  a->crash();
}

// The file turns to garbage after the start: the acquire that cannot read it fails, and the
// monitor, which then sees B's key rise, keeps that rise in memory and never writes the file over.
TEST_F(EpochsTest, AFileAnAcquireCouldNotReadIsNotWrittenOverByTheMonitor) {
  a->boot(a->options(), file_store.get());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  ASSERT_EQ(a->resource->state(), State::kReleased);
  write_file(path(), "1x\n");
  Outcome* refused = a->acquire();
  ASSERT_TRUE(run_until([&] { return refused->done(); }));
  ASSERT_FALSE(refused->result->has_value());
  ASSERT_TRUE(b->store.store("pgdata", {.used = 40, .seen = 40}).has_value());
  b->boot(b->options());
  const Key key_b = acquired(*b);
  ASSERT_TRUE(run_until([&] { return a->resource->epoch_high_water() == key_b.epoch(); }))
      << "A's monitor sees B's key";
  const std::uint64_t checks = a->resource->counters().checks;
  ASSERT_TRUE(run_until([&] { return a->resource->counters().checks > checks + 5; }));
  EXPECT_EQ(slurp(path()), "1x\n");
  a->crash();
}

// --- a missing file (docs/protocol.md, S3)
// --------------------------------------------------------

bool said(const Recorder& recorder, EventKind kind, const std::string& text) {
  return std::any_of(recorder.events.begin(), recorder.events.end(), [&](const auto& e) {
    return e.second.kind == kind && e.second.detail.find(text) != std::string::npos;
  });
}

// The node's file is lost while its key holds every LU: the start says so, does not adopt the key
// (it may have been given up), and stores above it, so neither this start nor the next adopts it
// and the next acquire draws above it.
TEST_F(EpochsTest, AMissingFileWhileOurKeyHoldsIsSaidAndRepaired) {
  a->boot(a->options());
  const Key key = acquired(*a);
  a->crash();
  a->store.forget("pgdata");
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_FALSE(a->resource->gate_open());
  EXPECT_TRUE(said(a->recorder, EventKind::kStateKnown,
                   "memory:pgdata.epoch was missing while key " + key.to_string()))
      << a->resource->detail();
  EXPECT_EQ(a->stored_epoch(), key.epoch() + 1) << "the key found is given up";
  a->crash();
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kReleased) << "not adopted by the next start either";
  EXPECT_GT(acquired(*a).epoch(), key.epoch() + 1);
}

// No file and no key of this node: the first start, said as nothing unusual.
TEST_F(EpochsTest, AMissingFileWithoutOurKeyIsAFirstStart) {
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_EQ(a->resource->detail(), "not held by this node");
  EXPECT_EQ(a->store.load("pgdata").value(), std::nullopt) << "nothing to keep yet";
}

// No file and the LUs cannot be read: the state is unknown and says both; an acquire reads the LUs
// before it draws, so it fails instead of drawing from 0; once they answer, the monitor's probe
// finds the key and repairs the file.
TEST_F(EpochsTest, AMissingFileAndUnreadableLusLeaveTheStateUnknown) {
  a->boot(a->options());
  const Key key = acquired(*a);
  a->crash();
  a->store.forget("pgdata");
  a->faults = [](const FaultContext& c) {
    Fault fault;
    fault.transport_error = c.command.cdb[0] == 0x5e;
    return fault;
  };
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kUnknown);
  EXPECT_NE(a->resource->detail().find("memory:pgdata.epoch does not exist"), std::string::npos)
      << a->resource->detail();
  const std::size_t before = sent.size();
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(outcome->result->error().code(), ErrorCode::kIndeterminate);
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  a->faults = nullptr;
  EXPECT_GT(acquired(*a).epoch(), key.epoch()) << "drawn above every key the read showed";
}

// The same, left alone: once the LUs answer, the monitor's probe finds the key and repairs the
// file.
TEST_F(EpochsTest, AMissingFileIsRepairedOnceTheLusAnswer) {
  a->boot(a->options());
  const Key key = acquired(*a);
  a->crash();
  a->store.forget("pgdata");
  a->faults = [](const FaultContext& c) {
    Fault fault;
    fault.transport_error = c.command.cdb[0] == 0x5e;
    return fault;
  };
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->resource->state(), State::kUnknown);
  a->faults = nullptr;
  ASSERT_TRUE(run_until([&] { return a->stored_epoch() != 0; }));
  EXPECT_EQ(a->stored_epoch(), key.epoch() + 1);
  EXPECT_EQ(a->resource->state(), State::kReleased);
  EXPECT_TRUE(
      said(a->recorder, EventKind::kStateKnown, "was missing while key " + key.to_string()));
}

// --- epochs seen from any node (S3)
// ---------------------------------------------------------------

// Counts the stores that reach the disk (each is an fsync on the event loop).
class CountingStore final : public EpochStore {
 public:
  Result<std::optional<StoredEpochs>> load(const std::string& resource) override {
    return memory.load(resource);
  }
  Result<void> store(const std::string& resource, StoredEpochs epochs) override {
    ++stores;
    return memory.store(resource, epochs);
  }
  std::string where(const std::string& resource) const override { return memory.where(resource); }

  MemoryEpochStore memory;
  std::size_t stores = 0;
};

// A store that did not report success may have reached the disk all the same: the daemon gives up
// waiting for a store after a bound, and the store completes later. Here the armed store writes
// and then fails; every write is kept, in order.
class LateStore final : public EpochStore {
 public:
  Result<std::optional<StoredEpochs>> load(const std::string& resource) override {
    return memory.load(resource);
  }
  Result<void> store(const std::string& resource, StoredEpochs epochs) override {
    written.push_back(epochs);
    (void)memory.store(resource, epochs);
    if (late) {
      late = false;
      return fail(ErrorCode::kOs,
                  "storing RESOURCE.epoch: not done after 500 ms (a stalled disk?)");
    }
    return {};
  }
  std::string where(const std::string& resource) const override { return memory.where(resource); }

  MemoryEpochStore memory;
  bool late = false;
  std::vector<StoredEpochs> written;
};

// The file never goes down, whatever a store reported: A's second acquire draws an epoch E and its
// store reaches the disk but reports a failure (the acquire fails, nothing is registered); then B
// holds with epoch E and A's monitor stores that rise. Without remembering the failed store, A
// would write "E-1 E" over "E E", the epoch it last used going down.
TEST_F(EpochsTest, AStoreThatFailedButReachedTheDiskIsNeverWrittenOver) {
  LateStore late;
  a->boot(a->options(), &late);
  const Key first = acquired(*a);
  ASSERT_EQ(first.epoch(), 1U);
  Outcome* released = a->release();
  ASSERT_TRUE(run_until([&] { return released->done(); }));
  late.late = true;
  Outcome* again = a->acquire();
  ASSERT_TRUE(run_until([&] { return again->done(); }));
  ASSERT_FALSE(again->result->has_value());
  const std::uint32_t drawn = late.written.back().used;  // on the disk, though the store failed
  const std::size_t before = late.written.size();
  ASSERT_TRUE(b->store.store("pgdata", {.used = drawn - 1, .seen = drawn - 1}).has_value());
  b->boot(b->options());
  ASSERT_EQ(acquired(*b).epoch(), drawn);
  run_for(milliseconds(1000));
  for (std::size_t i = 1; i < late.written.size(); ++i) {
    EXPECT_GE(late.written[i].used, late.written[i - 1].used) << "store " << i;
    EXPECT_GE(late.written[i].seen, late.written[i - 1].seen) << "store " << i;
  }
  EXPECT_GT(late.written.size(), before) << "A's monitor stored the rise it saw";
}

// B holds with epoch 41; A only starts and reads it. The target then forgets every registration
// (a CLEAR; a power cycle without APTPL is the same to the protocol): A's next acquire still draws
// above 41, from its own disk.
TEST_F(EpochsTest, AnEpochSeenFromAnotherNodeOutlivesATargetThatForgets) {
  ASSERT_TRUE(b->store.store("pgdata", {.used = 40, .seen = 40}).has_value());
  b->boot(b->options());
  const Key key_b = acquired(*b);
  ASSERT_EQ(key_b.epoch(), 41U);
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  EXPECT_EQ(a->seen_epoch(), 41U);
  EXPECT_EQ(a->stored_epoch(), 0U) << "A used no epoch: nothing of A's to adopt";
  b->crash();
  clear_every_lu(key_b);
  EXPECT_GT(acquired(*a).epoch(), 41U);
}

// The same when A's read fails half-way: A (restarted, its file holding epoch 3) reads B's key of
// epoch 41 in READ KEYS while its READ RESERVATION gets no answer, so its start ends unknown. The
// target then forgets every registration: what did come back still counts, stored on A's disk, and
// A's next acquire, after a restart too, draws above 41.
TEST_F(EpochsTest, AnEpochSeenByAReadThatFailedStillCounts) {
  ASSERT_TRUE(b->store.store("pgdata", {.used = 40, .seen = 40}).has_value());
  b->boot(b->options());
  const Key key_b = acquired(*b);
  ASSERT_EQ(key_b.epoch(), 41U);
  ASSERT_TRUE(a->store.store("pgdata", {.used = 3, .seen = 3}).has_value());
  a->faults = read_reservation_fails;
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  ASSERT_EQ(a->resource->state(), State::kUnknown);
  EXPECT_EQ(a->seen_epoch(), 41U) << "stored from the READ KEYS that answered";
  b->crash();
  clear_every_lu(key_b);
  a->crash();
  a->faults = nullptr;
  a->boot(a->options());
  EXPECT_GT(acquired(*a).epoch(), 41U);
}

// A cancelled acquire reads the LUs back before it ends: the key that took them meanwhile counts as
// seen from that read, before any monitor round, for a target without APTPL may lose it at its
// next power loss. (Simulation seed 514130068741 --strict-epochs: the read-back of a cancelled
// acquire was the only read that showed node 1's epoch 23 before the LU lost power, and the node
// drew epoch 22 after a restart.)
TEST_F(EpochsTest, AnEpochSeenByACancelledAcquiresReadBackCounts) {
  a->boot(a->options());
  auto registering = std::make_shared<bool>(false);
  a->faults = [registering](const FaultContext& c) {
    *registering = *registering || c.command.cdb[0] == 0x5f;
    return Fault{};
  };
  Outcome* outcome = a->acquire();
  ASSERT_TRUE(run_until([&] { return *registering; }));
  const Key taker = key_of(kNodeB, 60);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    register_directly(nexus_of(kNodeB, lu, 0), lu, taker.value());
    prout_directly(nexus_of(kNodeB, lu, 0), static_cast<LuId>(lu),
                   codec::prout_reserve(taker.value(), kWeRo));
  }
  a->resource->cancel();
  ASSERT_TRUE(run_until([&] { return outcome->done(); }));
  ASSERT_FALSE(outcome->result->has_value());
  EXPECT_EQ(a->seen_epoch(), 60U) << "stored from the read-back";
}

// A first start that found no key keeps no file; a later round whose READ RESERVATION fails while
// its READ KEYS shows B's key stores that epoch all the same, so a restart after the target forgot
// still draws above it.
TEST_F(EpochsTest, AFailedRoundAfterAFirstStartStoresWhatItSaw) {
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  ASSERT_EQ(a->resource->state(), State::kReleased);
  ASSERT_EQ(a->store.load("pgdata").value(), std::nullopt) << "a first start keeps no file";
  a->faults = read_reservation_fails;
  ASSERT_TRUE(b->store.store("pgdata", {.used = 40, .seen = 40}).has_value());
  b->boot(b->options());
  const Key key_b = acquired(*b);
  ASSERT_TRUE(run_until([&] { return a->seen_epoch() == key_b.epoch(); }))
      << "stored from a round whose READ RESERVATION failed";
  b->crash();
  clear_every_lu(key_b);
  a->crash();
  a->faults = nullptr;
  a->boot(a->options());
  EXPECT_GT(acquired(*a).epoch(), key_b.epoch());
}

// The monitor's reads store a rise too, once: a key of the cluster with a higher epoch appears on
// the LUs while A holds; A stores it at the next round that reads keys, and not again after.
TEST_F(EpochsTest, TheMonitorStoresARiseOnceAndOnlyARise) {
  CountingStore counting;
  a->boot(a->options(), &counting);
  const Key key = acquired(*a);
  // The monitor's first round stores that the acquire's REGISTERs were all answered; then nothing.
  ASSERT_TRUE(run_until([&] { return !counting.memory.load("pgdata").value()->registering; }));
  const std::size_t after_acquire = counting.stores;
  run_for(milliseconds(2000));
  EXPECT_EQ(counting.stores, after_acquire) << "no rise, no store";
  const Key racer = key_of(kNodeB, 50);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    register_directly(nexus_of(kNodeB, lu, 0), lu, racer.value());
  }
  ASSERT_TRUE(run_until([&] {
    const auto stored = counting.memory.load("pgdata");
    return stored && *stored && (*stored)->seen == 50;
  }));
  const auto stored = counting.memory.load("pgdata").value();
  EXPECT_EQ(stored->used, key.epoch()) << "a key seen is not a key used";
  const std::size_t after_rise = counting.stores;
  run_for(milliseconds(2000));
  EXPECT_LE(counting.stores, after_rise + 1) << "at most a give-up, if the racer fenced A";
  a->crash();
}

// Primary mode: members draw above the primary, so the highest epoch seen is above the primary's
// own. The primary that restarts is still adopted: adoption compares the epoch it used, not the one
// it saw.
TEST_F(EpochsTest, APrimaryWhoseMembersOutrankItIsAdoptedAfterARestart) {
  ResourceOptions primary_a = a->options(Mode::kShared);
  primary_a.primary = true;
  primary_a.type = kWeRo;
  ResourceOptions primary_b = b->options(Mode::kShared);
  primary_b.primary = true;
  primary_b.type = kWeRo;
  a->boot(primary_a);
  b->boot(primary_b);
  Outcome* joined = b->unfence();
  ASSERT_TRUE(run_until([&] { return joined->done(); }));
  Outcome* promoted = b->promote();
  ASSERT_TRUE(run_until([&] { return promoted->done(); }));
  ASSERT_TRUE(promoted->result->has_value()) << promoted->result->error().message();
  const Key primary = **promoted->result;
  Outcome* member = a->unfence();
  ASSERT_TRUE(run_until([&] { return member->done(); }));
  ASSERT_TRUE(member->result->has_value()) << member->result->error().message();
  ASSERT_GT((*member->result)->epoch(), primary.epoch());
  ASSERT_TRUE(run_until([&] { return b->seen_epoch() == (*member->result)->epoch(); }))
      << "B's monitor stores the member's epoch";
  b->crash();
  b->boot(primary_b);
  b->resource->start(now());
  ASSERT_TRUE(run_until([&] { return b->resource->state_known(); }));
  EXPECT_EQ(b->resource->state(), State::kHeld) << b->resource->detail();
  EXPECT_EQ(b->resource->key(), primary);
}

// --- the top of the epoch space (docs/protocol.md)
// ---------------------------------------------------------------------

class TopOfEpochSpaceTest : public EpochsTest, public ::testing::WithParamInterface<Operation> {
 protected:
  Outcome* run_operation(Node& node) {
    switch (GetParam()) {
      case Operation::kAcquire: return node.acquire();
      case Operation::kPromote: return node.promote();
      case Operation::kUnfence: return node.unfence();
    }
    return nullptr;
  }
};

// A key of the cluster with epoch 0xffffffff, registered by a host that is no node (typed by hand):
// the operation refuses before it draws or sends anything, naming the key; the epoch is never
// stored as seen, by the operation or the monitor; once the key is gone, the same operation draws
// epoch 1, so the stray did not end the epoch space.
TEST_P(TopOfEpochSpaceTest, AStrayKeyIsRefusedByNameAndNeverStored) {
  const NexusId stranger = nexus_of(9, 0, 0);
  const Key stray = key_of(7, 0xffffffff);
  register_directly(stranger, 0, stray.value());
  a->boot(options_for(*a, GetParam()));
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  if (GetParam() == Operation::kPromote) {
    Outcome* joined = a->unfence();  // blocked too: a member draws in primary mode
    ASSERT_TRUE(run_until([&] { return joined->done(); }));
    ASSERT_FALSE(joined->result->has_value());
  }
  const std::size_t before = sent.size();
  Outcome* refused = run_operation(*a);
  ASSERT_TRUE(run_until([&] { return refused->done(); }));
  ASSERT_FALSE(refused->result->has_value());
  const std::string message = refused->result->error().message();
  EXPECT_NE(message.find("lu0: " + stray.to_string()), std::string::npos) << message;
  EXPECT_NE(message.find("never draws"), std::string::npos) << message;
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
  const std::uint64_t rounds = a->resource->counters().checks;
  ASSERT_TRUE(run_until([&] { return a->resource->counters().checks > rounds + 3; }));
  EXPECT_EQ(a->seen_epoch(), 0U) << "the stray's epoch is not stored";
  EXPECT_EQ(a->resource->epoch_high_water(), 0U);

  prout_directly(stranger, 0, codec::prout_register(stray.value(), 0));
  if (GetParam() == Operation::kPromote) {
    Outcome* joined = a->unfence();
    ASSERT_TRUE(run_until([&] { return joined->done(); }));
    ASSERT_TRUE(joined->result->has_value()) << joined->result->error().message();
  }
  Outcome* done = run_operation(*a);
  ASSERT_TRUE(run_until([&] { return done->done(); }));
  ASSERT_TRUE(done->result->has_value()) << done->result->error().message();
  EXPECT_EQ((*done->result)->epoch(), GetParam() == Operation::kPromote ? 2U : 1U);
}

// The last epoch a draw may take is Key::kEpochDrawMax: past it every draw refuses and says how to
// start the space again, without sending anything.
TEST_P(TopOfEpochSpaceTest, TheSpaceEndsBelowTheReservedTopAndSaysHowToRestart) {
  ASSERT_TRUE(a->store.store("pgdata", {.used = Key::kEpochDrawMax, .seen = Key::kEpochDrawMax})
                  .has_value());
  a->boot(options_for(*a, GetParam()));
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  const std::size_t before = sent.size();
  Outcome* refused = run_operation(*a);
  ASSERT_TRUE(run_until([&] { return refused->done(); }));
  ASSERT_FALSE(refused->result->has_value());
  EXPECT_NE(refused->result->error().message().find("the epoch space is exhausted"),
            std::string::npos)
      << refused->result->error().message();
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.is_prout(); }));
}

// A file an earlier release wrote with a stray's epoch as seen: the stray hid what was seen before
// it, and what the node used itself is what is left to draw above.
TEST_F(EpochsTest, AFileWithAStraysEpochAsSeenDrawsAboveTheNodesOwn) {
  ASSERT_TRUE(a->store.store("pgdata", {.used = 5, .seen = 0xffffffff}).has_value());
  a->boot(a->options());
  EXPECT_EQ(acquired(*a).epoch(), 6U);
}

INSTANTIATE_TEST_SUITE_P(Operations, TopOfEpochSpaceTest,
                         ::testing::Values(Operation::kAcquire, Operation::kPromote,
                                           Operation::kUnfence),
                         [](const ::testing::TestParamInfo<Operation>& param_info) {
                           return name_of(param_info.param);
                         });

// --- APTPL (docs/protocol.md)
// ---------------------------------------------------------------------

// Every LU reports PTPL_C: every REGISTER of the node, the unregister of its release included,
// carries APTPL=1, and the target has APTPL active on every LU.
TEST_F(EpochsTest, RegistersCarryAptplWhereEveryLuReportsPtplC) {
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  const std::size_t before = sent.size();
  (void)acquired(*a);
  const auto mine = a->sent_since(before);
  ASSERT_TRUE(std::any_of(mine.begin(), mine.end(), [](const Sent& s) { return s.registers(); }));
  for (const Sent& s : mine) {
    if (s.is(PrOutAction::kRegister) || s.is(PrOutAction::kRegisterAndIgnoreExistingKey)) {
      EXPECT_TRUE(s.aptpl) << "a REGISTER without APTPL on nexus " << s.nexus;
    }
  }
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_TRUE(target.aptpl_active(static_cast<LuId>(lu))) << "lu" << lu;
  }
}

// One LU does not report PTPL_C: no REGISTER carries APTPL (it would be refused there, and APTPL
// on some LUs only would keep some tokens and lose others), and acquire works as before.
TEST_F(EpochsTest, NoRegisterCarriesAptplWhereOneLuLacksPtplC) {
  target.set_ptpl_capable(1, false);
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  const std::size_t before = sent.size();
  (void)acquired(*a);
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) { return s.aptpl; }));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_FALSE(target.aptpl_active(static_cast<LuId>(lu))) << "lu" << lu;
  }
}

// The LUs did not answer REPORT CAPABILITIES at the start: the acquire asks again before it
// registers, rather than register without APTPL and turn it off on a target that keeps it.
TEST_F(EpochsTest, CapabilitiesUnreadAtTheStartAreReadBeforeRegistering) {
  bool unreachable = true;
  a->faults = [&unreachable](const FaultContext& c) {
    Fault fault;
    fault.transport_error = unreachable && c.command.cdb[0] == 0x5e;
    return fault;
  };
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  unreachable = false;
  const std::size_t before = sent.size();
  (void)acquired(*a);
  const auto mine = a->sent_since(before);
  ASSERT_TRUE(std::any_of(mine.begin(), mine.end(), [](const Sent& s) { return s.registers(); }));
  EXPECT_TRUE(std::all_of(mine.begin(), mine.end(),
                          [](const Sent& s) { return !s.registers() || s.aptpl; }));
}

// --- a target that forgets (SimTarget::power_cycle)
// -----------------------------------------------

// Without PTPL_C the nodes register without APTPL, and a power cycle of every LU takes the holder's
// key away: A's gate closes at its next round, and B, which saw A's epoch while it ran, acquires
// above it although the LUs show nothing.
TEST_F(EpochsTest, APowerCycleWithoutAptplFencesTheHolderAndEpochsStillGrow) {
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    target.set_ptpl_capable(static_cast<LuId>(lu), false);
  }
  a->boot(a->options());
  b->boot(b->options());
  a->resource->start(now());
  b->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known() && b->resource->state_known(); }));
  const Key key_a = acquired(*a);
  ASSERT_TRUE(run_until([&] { return b->seen_epoch() == key_a.epoch(); }));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_FALSE(target.power_cycle(static_cast<LuId>(lu)));
  }
  ASSERT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
  EXPECT_GT(acquired(*b).epoch(), key_a.epoch());
}

// With PTPL_C (LIO) the same power cycle changes nothing: the target kept the registrations and the
// reservation, and A's gate stays open.
TEST_F(EpochsTest, APowerCycleWithAptplKeepsTheHolder) {
  a->boot(a->options());
  a->resource->start(now());
  ASSERT_TRUE(run_until([&] { return a->resource->state_known(); }));
  const Key key_a = acquired(*a);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_TRUE(target.power_cycle(static_cast<LuId>(lu)));
  }
  run_for(milliseconds(2000));
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->resource->key(), key_a);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_EQ(holder_of(lu), key_a.value());
  }
}

}  // namespace
}  // namespace blkfence::fence::test

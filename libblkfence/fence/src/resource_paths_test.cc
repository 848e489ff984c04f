// Proves fence::Resource's path hot-plug (docs/protocol.md, "Paths") on the bench of
// resource_test_bench.h: a new path of a held LU is registered with the current key, never after
// a fence (S5), registered once contact is back when it appeared while contact was lost or its
// first read failed, not while a path of its LU holds commands back, registered for a shared member
// without an epoch file, taken back when a preempt landed just before it, and never taken back
// unread when the read after its REGISTER fails (S4: the monitor reads at once instead); a release
// asked for meanwhile waits for the registration instead of failing; one hung path of a multipath
// LU never costs contact while the other path answers; a device found again under its H:C:T:L is a
// new path, and the fd of the old one is closed.
#include <gtest/gtest.h>

#include "resource_test_bench.h"

namespace blkfence::fence::test {
namespace {

// Path hot-plug: a new path of a LU this node holds is registered with the current key, after a
// read and after the epoch file says a REGISTER is under way, and the key stays the verified
// holder; a path that went away is dropped from the LU.
TEST_F(ResourceTest, ANewPathOfAHeldLuIsRegisteredWithTheCurrentKey) {
  a->boot(a->options());
  const Key key = acquired(*a);
  const std::string device = "/dev/sg-n1-0-new";
  const NexusId nexus = nexus_of(kNodeA, 0, 5);
  target.add_path(device, 0, nexus);
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.erase(paths.begin());  // the first path went away
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
  // The acquire's REGISTERs were all answered: the monitor says so in the epoch file. The new
  // path's REGISTER is sent only once the file says a REGISTER is under way again, so that a
  // restart waits for it should its outcome be unknown (docs/protocol.md, "Late registrations").
  ASSERT_TRUE(run_until([&] { return !a->store.load("pgdata").value()->registering; }));
  auto marked_when_sent = std::make_shared<std::optional<bool>>();
  a->faults = [&, marked_when_sent](const FaultContext& c) {
    if (c.nexus == nexus && c.command.cdb[0] == 0x5f) {
      *marked_when_sent = a->store.load("pgdata").value()->registering;
    }
    return Fault{};
  };
  const std::size_t before = sent.size();
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_EQ(*marked_when_sent, std::optional(true));
  EXPECT_TRUE(run_until([&] { return !a->store.load("pgdata").value()->registering; }));
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

// A device removed and found again under the same H:C:T:L (delete, then a rescan of its host): the
// kernel gives it new node names while the old fd holds the removed one. The old path is dropped
// and its fd closed; the device under its new name is a new path, registered with the current key
// while this node holds (its H:C:T:L alone would hide the change and keep the dead fd in use).
TEST_F(ResourceTest, ADeviceFoundAgainUnderItsHctlIsANewPathAndTheOldFdIsClosed) {
  a->boot(a->options());
  const Key key = acquired(*a);
  const std::size_t open_before = a->transport->open_paths();
  ASSERT_EQ(open_before, 6U) << "every path of A's 3 LUs is open after the acquire";
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  const pr::Path gone = paths[0];

  paths.erase(paths.begin());
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_EQ(a->transport->open_paths(), open_before - 1) << "the removed path's fd is still open";

  // Back under its H:C:T:L with a new name, on the same I_T nexus; the same happens when the
  // removal and the return are seen in one rescan.
  const std::string renamed = "/dev/sg-n1-0-0-again";
  target.add_path(renamed, 0, nexus_of(kNodeA, 0, 0));
  paths.insert(paths.begin(),
               pr::Path{.sg = renamed, .sd = {}, .hctl = gone.hctl, .initiator = {}});
  const std::size_t before = sent.size();
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  const auto mine = a->sent_since(before);
  EXPECT_EQ(std::count_if(mine.begin(), mine.end(),
                          [&](const Sent& s) {
                            return s.registers() && s.sa_key == key.value() &&
                                   s.nexus == nexus_of(kNodeA, 0, 0);
                          }),
            1);
  EXPECT_EQ(a->resource->options().lus[0].paths[0].sg, renamed);

  const pr::Path renamed_path = a->resource->options().lus[0].paths[0];
  const std::string renamed_again = "/dev/sg-n1-0-0-third";
  target.add_path(renamed_again, 0, nexus_of(kNodeA, 0, 0));
  paths[0] = pr::Path{.sg = renamed_again, .sd = {}, .hctl = renamed_path.hctl, .initiator = {}};
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_EQ(a->resource->options().lus[0].paths[0].sg, renamed_again);
  EXPECT_EQ(a->transport->open_paths(), open_before) << "one fd per path, none for the old names";
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_EQ(a->recorder.count(EventKind::kLostContact), 0U);
}

// A path that appears while contact is lost is not registered then (whether the key is current
// is not known), nor forgotten: once contact is back and the key is still the only holder, it is
// registered, read first. (Simulation seed 503482727393 --strict-epochs --hotplug: a holder's only
// path left to a LU was one that appeared during lost contact and was never registered; its
// monitor's PREEMPT AND ABORT of a stray through it got RESERVATION CONFLICT for 26 s.)
TEST_F(ResourceTest, ANewPathThatAppearsDuringLostContactIsRegisteredOnceContactIsBack) {
  a->boot(a->options());
  const Key key = acquired(*a);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kNoAnswer);
  }
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kLostContact; }));
  const std::string device = "/dev/sg-n1-0-new";
  target.add_path(device, 0, nexus_of(kNodeA, 0, 5));
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
  a->resource->update_paths(0, paths, now());
  run_for(kCheckInterval * 3);
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value()}))
      << "registered while contact was lost";
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kUp);
  }
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open(); }));
  ASSERT_TRUE(run_until([&] { return keys_on(0).size() == 3; })) << "never registered";
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value(), key.value()}));
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_TRUE(a->resource->gate_open());
}

// A new path of a LU whose paths hold commands back (a blocked SCSI device: the count of writes in
// flight fails with EBUSY) is not registered while they do: its REGISTER would wait at the head of
// that queue and could go out long after a fence. It is registered at a round once none does.
TEST_F(ResourceTest, ANewPathWaitsWhileAPathOfItsLuHoldsCommandsBack) {
  bool blocked = false;
  ResourceOptions options = a->options();
  options.writes_in_flight = [&blocked](const pr::LogicalUnit& lu) -> Result<std::uint64_t> {
    if (blocked && lu.name == "lu0") {
      return tl::unexpected(Error::os(EBUSY, "/dev/sdb may hold writes that no count shows"));
    }
    return 0;
  };
  a->boot(options);
  const Key key = acquired(*a);
  blocked = true;
  const std::string device = "/dev/sg-n1-0-new";
  target.add_path(device, 0, nexus_of(kNodeA, 0, 5));
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
  a->resource->update_paths(0, paths, now());
  run_for(kCheckInterval * 4);
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value()}))
      << "registered while a path of the LU held commands back";
  EXPECT_TRUE(a->resource->gate_open());
  blocked = false;
  ASSERT_TRUE(run_until([&] { return keys_on(0).size() == 3; })) << "never registered";
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value(), key.value()}));
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_EQ(a->resource->state(), State::kHeld);
}

// A path that appears just as contact goes: its registration's first read fails. Whether the key
// is current was not shown, so the path is registered after the next round that reads every LU
// and finds the key current, here once contact is back.
TEST_F(ResourceTest, ANewPathWhoseFirstReadFailsIsRegisteredAfterAGoodRound) {
  a->boot(a->options());
  const Key key = acquired(*a);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kNoAnswer);
  }
  const std::string device = "/dev/sg-n1-0-new";
  target.add_path(device, 0, nexus_of(kNodeA, 0, 5));
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return a->resource->state() == State::kLostContact; }));
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    a->transport->set_link(static_cast<LuId>(lu), LinkState::kUp);
  }
  ASSERT_TRUE(run_until([&] { return a->resource->gate_open(); }));
  ASSERT_TRUE(run_until([&] { return keys_on(0).size() == 3; })) << "never registered";
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value(), key.value()}));
}

// Shared mode: a member's key has epoch 0 and it keeps no epoch file; its new paths are registered
// all the same (a late REGISTER of the one member key changes nothing, so no mark is needed).
TEST_F(ResourceTest, ANewPathOfASharedMemberIsRegisteredWithoutAnEpochFile) {
  a->boot(a->options(Mode::kShared));
  Outcome* unfenced = a->unfence();
  ASSERT_TRUE(run_until([&] { return unfenced->done(); }));
  ASSERT_TRUE(unfenced->result->has_value()) << unfenced->result->error().message();
  const Key key = **unfenced->result;
  ASSERT_EQ(a->store.load("pgdata").value(), std::nullopt);
  const std::string device = "/dev/sg-n1-0-new";
  target.add_path(device, 0, nexus_of(kNodeA, 0, 5));
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value(), key.value()}));
  EXPECT_TRUE(a->resource->gate_open());
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
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
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

// Preempted between the read and the REGISTER of a new path: the read afterwards sees it and the
// fence is declared on that read, the gate closing at once: the new path carries the preempted key,
// so the target lets the writer through it until it is taken back. Then the registration is taken
// back; here that unregister takes a check interval to get through, and the gate must not stay
// open for it.
TEST_F(ResourceTest, ANewPathRegisteredJustAfterAPreemptIsTakenBack) {
  a->boot(a->options());
  const Key key_a = acquired(*a);
  const std::string device = "/dev/sg-n1-0-new";
  const NexusId nexus = nexus_of(kNodeA, 0, 5);
  target.add_path(device, 0, nexus);
  // B preempts A the moment A's REGISTER of the new path is on the wire.
  bool preempted = false;
  a->faults = [&](const FaultContext& c) {
    if (c.nexus == nexus && c.command.cdb[0] == 0x5f && preempted) {
      Fault late;  // the unregister
      late.request_delay = kCheckInterval;
      return late;
    }
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
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->gate_open(); }));
  ASSERT_TRUE(preempted);
  EXPECT_EQ(a->resource->state(), State::kFenced);
  EXPECT_TRUE(a->resource->busy()) << "the gate stayed open until the new path was taken back";
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_FALSE(a->resource->gate_open());
  const auto keys = keys_on(0);
  EXPECT_TRUE(std::none_of(keys.begin(), keys.end(), [&](std::uint64_t k) {
    return k == key_a.value();
  })) << "the new path's registration was taken back";
  a->faults = nullptr;
}

// Preempted before the read that starts a new path's registration: nothing is registered, and the
// fence is declared on that read, as a monitor's round would declare it, not left to the next one.
TEST_F(ResourceTest, ANewPathsFirstReadThatShowsAPreemptDeclaresTheFence) {
  a->boot(a->options());
  const Key key_a = acquired(*a);
  const std::string device = "/dev/sg-n1-0-new";
  target.add_path(device, 0, nexus_of(kNodeA, 0, 5));
  const Key key_b = key_of(kNodeB, key_a.epoch() + 1);
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    register_directly(nexus_of(kNodeB, lu, 0), static_cast<LuId>(lu), key_b.value());
    prout_directly(nexus_of(kNodeB, lu, 0), static_cast<LuId>(lu),
                   codec::prout_preempt(key_b.value(), key_a.value(), kWeRo));
  }
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
  const std::size_t before = sent.size();
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  EXPECT_EQ(a->resource->state(), State::kFenced)
      << "the read showed the fence, nobody declared it";
  EXPECT_FALSE(a->resource->gate_open());
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) {
    return s.opcode == 0x5f;
  })) << "a PR OUT went out after the read showed the fence";
}

// S4: when the read after registering a new path fails, what the REGISTER did is unknown (and a
// path that came back may be the very nexus that holds the reservation), so nothing is taken back:
// no unregister is sent, the registration ends failed as indeterminate, and the monitor reads at
// once, keys included. Here every read of A's fails from the new path's REGISTER until the
// registration has ended.
TEST_F(ResourceTest, ANewPathIsNotTakenBackWhenTheReadAfterItsRegisterFails) {
  a->boot(a->options());
  const Key key = acquired(*a);
  const std::string device = "/dev/sg-n1-0-new";
  const NexusId nexus = nexus_of(kNodeA, 0, 5);
  target.add_path(device, 0, nexus);
  bool registered = false;
  a->faults = [&](const FaultContext& c) {
    Fault fault;
    registered = registered || (c.nexus == nexus && c.command.cdb[0] == 0x5f);
    fault.transport_error = registered && c.command.cdb[0] == 0x5e && a->resource->busy();
    return fault;
  };
  std::vector<pr::Path> paths = a->resource->options().lus[0].paths;
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
  const std::size_t before = sent.size();
  a->resource->update_paths(0, paths, now());
  ASSERT_TRUE(run_until([&] { return !a->resource->busy(); }));
  ASSERT_TRUE(registered);
  const auto failed = a->recorder.last(EventKind::kOperationFailed);
  ASSERT_TRUE(failed.has_value());
  EXPECT_NE(failed->second.detail.find("reading back after registering failed"), std::string::npos)
      << failed->second.detail;
  run_for(kCheckInterval);
  const auto mine = a->sent_since(before);
  EXPECT_TRUE(std::none_of(mine.begin(), mine.end(), [](const Sent& s) {
    return s.is(PrOutAction::kRegister) && s.sa_key == 0;
  })) << "a new path was unregistered without a good read";
  // The monitor's next round starts the moment the registration failed, and reads the keys.
  for (std::size_t lu = 0; lu < kLus; ++lu) {
    EXPECT_TRUE(std::any_of(mine.begin(), mine.end(),
                            [&](const Sent& s) {
                              return s.at == failed->first && s.lu == lu && s.opcode == 0x5e &&
                                     s.action ==
                                         static_cast<std::uint8_t>(codec::PrInAction::kReadKeys);
                            }))
        << "no READ KEYS of LU " << lu << " when the registration failed";
  }
  EXPECT_EQ(keys_on(0), (std::vector<std::uint64_t>{key.value(), key.value(), key.value()}));
  EXPECT_EQ(holder_of(0), key.value());
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kHeld);
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
  paths.push_back(pr::Path{.sg = device, .sd = {}, .hctl = device, .initiator = {}});
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

// One path of every LU stops answering (its commands vanish, as behind a dead link the host has
// not noticed), later it comes back and the other one hangs: the monitor's reads get through the
// path that answers, the gate stays open, there is no lost contact, and after the round that
// found a path hung it is not read from again while the other answers.
TEST_F(ResourceTest, AHungPathOfAMultipathLuNeverCostsContact) {
  a->boot(a->options());
  const Key key = acquired(*a);
  run_for(kCheckInterval);
  std::size_t hung_path = 0;
  const auto hung = [&hung_path](NexusId nexus) {
    return node_of_nexus(nexus) == kNodeA && nexus % 10U == hung_path;  // of every LU
  };
  a->faults = [&hung](const FaultContext& c) {
    Fault fault;
    fault.drop_request = hung(c.nexus);
    return fault;
  };
  const Time cut = now();
  for (const std::size_t path : {0U, 1U}) {
    hung_path = path;
    const std::size_t from = sent.size();
    const Time hung_at = now();
    run_for(5 * kLease);
    std::size_t late = 0;
    for (const Sent& s : a->sent_since(from)) {
      // The round under way when the path hung, and the next, may still start on it.
      if (hung(s.nexus) && s.at >= hung_at + 2 * (kCheckInterval + kCommandTimeout)) {
        ++late;
      }
    }
    EXPECT_EQ(late, 0U) << "path " << path
                        << " is tried first only in the round that found it hung";
  }
  EXPECT_EQ(a->recorder.count(EventKind::kLostContact), 0U);
  EXPECT_TRUE(a->resource->gate_open());
  EXPECT_EQ(a->resource->state(), State::kHeld);
  EXPECT_EQ(a->resource->key(), key);
  for (const Recorder::Gate& gate : a->recorder.gates) {
    EXPECT_TRUE(gate.at < cut || gate.open) << "the gate closed at " << gate.at.count() << " ns";
  }
  a->faults = nullptr;
}

}  // namespace
}  // namespace blkfence::fence::test

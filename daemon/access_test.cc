// Proves who may send which control request (access.h, docs/control-protocol.md "Permissions"):
// every read op is open to any user; every state change is open to root, to a peer whose primary
// or supplementary group is control_group, and to nobody else, including when no control_group is
// configured or the configured one does not exist. It also proves the group is looked up once,
// when it is resolved, and never by a decision (the daemon's event loop never waits on NSS; the
// daemon resolves it once at start, daemon_control_test.cc). The matrix at the end checks
// every peer kind against every configuration and op at once, and that privileged() (the control
// socket's reserved places) agrees with the right to change state in every cell.
#include "access.h"

#include <gtest/gtest.h>

namespace blkfence::daemon {
namespace {

using control::Op;

constexpr gid_t kControlGid = 4242;
constexpr uid_t kUser = 1000;
int g_lookups = 0;

std::optional<gid_t> fake_lookup(const std::string& name) {
  ++g_lookups;
  return name == "blkfence" ? std::optional<gid_t>(kControlGid) : std::nullopt;
}

constexpr Op kReads[] = {Op::kStatus, Op::kKeys, Op::kWatch, Op::kGate, Op::kMetrics};
constexpr Op kChanges[] = {Op::kAcquire, Op::kRelease, Op::kFence, Op::kUnfence, Op::kPromote};

class AccessTest : public ::testing::Test {
 protected:
  void SetUp() override { g_lookups = 0; }
  // Resolved as the daemon does at start.
  static ControlGroup group(const std::string& name) {
    return resolve_control_group(name, fake_lookup);
  }
};

TEST_F(AccessTest, ReadsAndChangesAreTheDocumentedOps) {
  for (const Op op : kReads) {
    EXPECT_FALSE(control::changes_state(op)) << control::to_string(op);
  }
  for (const Op op : kChanges) {
    EXPECT_TRUE(control::changes_state(op)) << control::to_string(op);
  }
}

TEST_F(AccessTest, AnyoneMayRead) {
  const Peer stranger{.pid = 1, .uid = kUser, .gid = 100, .groups = {}};
  for (const Op op : kReads) {
    EXPECT_TRUE(may_run(op, stranger, group(""))) << control::to_string(op);
    EXPECT_TRUE(may_run(op, stranger, group("blkfence"))) << control::to_string(op);
  }
}

TEST_F(AccessTest, RootMayChangeWithOrWithoutAGroup) {
  const Peer root{.pid = 1, .uid = 0, .gid = 0, .groups = {}};
  for (const Op op : kChanges) {
    EXPECT_TRUE(may_run(op, root, group(""))) << control::to_string(op);
    EXPECT_TRUE(may_run(op, root, group("blkfence"))) << control::to_string(op);
    EXPECT_TRUE(may_run(op, root, group("no-such-group"))) << control::to_string(op);
  }
}

TEST_F(AccessTest, WithoutAControlGroupOnlyRootMayChange) {
  // Even a peer whose group id happens to be the one a group would have: no group, no members.
  const Peer user{.pid = 1, .uid = kUser, .gid = kControlGid, .groups = {kControlGid}};
  for (const Op op : kChanges) {
    EXPECT_FALSE(may_run(op, user, group(""))) << control::to_string(op);
  }
  EXPECT_EQ(g_lookups, 0);  // no group, no lookup
}

TEST_F(AccessTest, PrimaryGroupMemberMayChange) {
  const Peer member{.pid = 1, .uid = kUser, .gid = kControlGid, .groups = {}};
  for (const Op op : kChanges) {
    EXPECT_TRUE(may_run(op, member, group("blkfence"))) << control::to_string(op);
  }
}

TEST_F(AccessTest, SupplementaryGroupMemberMayChange) {
  const Peer member{.pid = 1, .uid = kUser, .gid = 100, .groups = {27, kControlGid, 100}};
  for (const Op op : kChanges) {
    EXPECT_TRUE(may_run(op, member, group("blkfence"))) << control::to_string(op);
  }
}

TEST_F(AccessTest, OtherUsersMayNotChange) {
  const Peer other{.pid = 1, .uid = kUser, .gid = 100, .groups = {27, 100}};
  const ControlGroup resolved = group("blkfence");
  for (const Op op : kChanges) {
    EXPECT_FALSE(may_run(op, other, resolved)) << control::to_string(op);
    EXPECT_FALSE(privileged(other, resolved));
  }
  EXPECT_EQ(g_lookups, 1);  // when it was resolved, never by a decision
}

TEST_F(AccessTest, AGroupThatDoesNotExistAdmitsNobodyButRoot) {
  // A member of a group with the id the missing group "would" have is not let in by accident.
  const Peer user{.pid = 1, .uid = kUser, .gid = kControlGid, .groups = {kControlGid}};
  for (const Op op : kChanges) {
    EXPECT_FALSE(may_run(op, user, group("no-such-group"))) << control::to_string(op);
  }
}

TEST_F(AccessTest, GroupIdReadsTheGroupDatabase) {
  // Group 0 is root's on every Linux system; its name is whatever this system calls it.
  EXPECT_EQ(group_id("root"), std::optional<gid_t>(0));
  EXPECT_EQ(group_id("blkfence-no-such-group-x"), std::nullopt);
}

TEST_F(AccessTest, TheMatrixOfPeersGroupsAndOps) {
  struct PeerCase {
    const char* what;
    Peer peer;
    bool member;  // of "blkfence" (gid kControlGid)
  };
  const PeerCase peers[] = {
      {"root", {.pid = 1, .uid = 0, .gid = 0, .groups = {}}, false},
      {"root in another group", {.pid = 1, .uid = 0, .gid = 100, .groups = {27}}, false},
      {"primary member", {.pid = 1, .uid = kUser, .gid = kControlGid, .groups = {}}, true},
      {"supplementary member",
       {.pid = 1, .uid = kUser, .gid = 100, .groups = {27, kControlGid}},
       true},
      {"other user", {.pid = 1, .uid = kUser, .gid = 100, .groups = {27, 100}}, false},
      {"nobody", {.pid = 1, .uid = 65534, .gid = 65534, .groups = {}}, false},
      {"uid 0 elsewhere only",
       {.pid = 1, .uid = kUser, .gid = 0, .groups = {0}},
       false},  // group root is not user root
  };
  for (const std::string group : {"", "blkfence", "no-such-group"}) {
    const ControlGroup resolved = resolve_control_group(group, fake_lookup);
    for (const PeerCase& c : peers) {
      const bool root = c.peer.uid == 0;
      const bool may_change = root || (group == "blkfence" && c.member);
      EXPECT_EQ(privileged(c.peer, resolved), may_change)
          << c.what << ", control_group \"" << group << "\"";
      for (const Op op : kReads) {
        EXPECT_TRUE(may_run(op, c.peer, resolved)) << c.what << " " << to_string(op);
      }
      for (const Op op : kChanges) {
        EXPECT_EQ(may_run(op, c.peer, resolved), may_change)
            << c.what << ", control_group \"" << group << "\", " << to_string(op);
      }
    }
  }
}

}  // namespace
}  // namespace blkfence::daemon

// Who may send which control request (daemon layer). See access.h.
#include "access.h"

#include <algorithm>

#include <grp.h>

namespace blkfence::daemon {

std::optional<gid_t> group_id(const std::string& name) {
  const group* entry = ::getgrnam(name.c_str());
  if (entry == nullptr) {
    return std::nullopt;
  }
  return entry->gr_gid;
}

bool may_run(control::Op op, const Peer& peer, const std::string& control_group,
             GroupLookup lookup) {
  return !control::changes_state(op) || privileged(peer, control_group, lookup);
}

bool privileged(const Peer& peer, const std::string& control_group, GroupLookup lookup) {
  if (peer.uid == 0) {
    return true;
  }
  if (control_group.empty()) {
    return false;
  }
  const std::optional<gid_t> gid = lookup(control_group);
  if (!gid) {
    return false;
  }
  return peer.gid == *gid ||
         std::find(peer.groups.begin(), peer.groups.end(), *gid) != peer.groups.end();
}

}  // namespace blkfence::daemon

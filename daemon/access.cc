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

ControlGroup resolve_control_group(const std::string& name, GroupLookup lookup) {
  return ControlGroup{.name = name, .gid = name.empty() ? std::nullopt : lookup(name)};
}

bool may_run(control::Op op, const Peer& peer, const ControlGroup& group) {
  return !control::changes_state(op) || privileged(peer, group);
}

bool privileged(const Peer& peer, const ControlGroup& group) {
  if (peer.uid == 0) {
    return true;
  }
  if (!group.gid) {
    return false;
  }
  return peer.gid == *group.gid ||
         std::find(peer.groups.begin(), peer.groups.end(), *group.gid) != peer.groups.end();
}

}  // namespace blkfence::daemon

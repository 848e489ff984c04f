// Who may send which control request (daemon layer; docs/control-protocol.md, "Permissions").
//
// Reads (status, keys, watch, gate, metrics) are for anyone who can connect; state changes
// (acquire, release, fence, unfence, promote) for root, or for a member of control_group when the
// configuration names one: its primary group or a supplementary one, as SO_PEERCRED and
// SO_PEERGROUPS reported them at accept. The group is looked up by name once, when the daemon
// starts (resolve_control_group), never per request or connection: getgrnam() may wait on NSS
// (LDAP, sssd), and the event loop must not. A group created or renumbered later counts after a
// restart. The lookup is a parameter so that the decision is tested without /etc/group.
// Thread-safe when the lookup is.
#pragma once

#include <optional>
#include <string>

#include <sys/types.h>

#include "blkfence/control/protocol.h"

#include "control_server.h"

namespace blkfence::daemon {

// A group's id by name; nullopt when there is no such group.
using GroupLookup = std::optional<gid_t> (*)(const std::string& name);
std::optional<gid_t> group_id(const std::string& name);

// The configuration's control_group as resolved at start: its name ("" for none) and its id
// (nullopt when none is set, or no group had that name then: nobody but root is admitted).
struct ControlGroup {
  std::string name;
  std::optional<gid_t> gid;
};
// Looks name up once (not at all when it is "").
[[nodiscard]] ControlGroup resolve_control_group(const std::string& name,
                                                 GroupLookup lookup = group_id);

// Whether peer may change state: root, or a member of the control group (primary or
// supplementary) when it resolved. Such peers also use the control socket's reserved places
// (control_server.h).
[[nodiscard]] bool privileged(const Peer& peer, const ControlGroup& group);

// Whether peer may send a request of this op.
[[nodiscard]] bool may_run(control::Op op, const Peer& peer, const ControlGroup& group);

}  // namespace blkfence::daemon

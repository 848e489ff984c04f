// Who may send which control request (daemon layer; docs/control-protocol.md, "Permissions").
//
// Reads (status, keys, watch, gate, metrics) are for anyone who can connect; state changes
// (acquire, release, fence, unfence, promote) for root, or for a member of control_group when the
// configuration names one: its primary group or a supplementary one, as SO_PEERCRED and
// SO_PEERGROUPS reported them at accept. The group is looked up by name when a decision needs it,
// not at start, so a group created after the daemon started counts; the lookup is a parameter so
// that the decision is tested without /etc/group. Thread-safe when the lookup is.
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

// Whether peer may change state: root, or a member of control_group (primary or supplementary)
// when one is set. Such peers also use the control socket's reserved places (control_server.h).
// lookup is called only for someone other than root, and only when control_group is set.
[[nodiscard]] bool privileged(const Peer& peer, const std::string& control_group,
                              GroupLookup lookup = group_id);

// Whether peer may send a request of this op. control_group is the configuration's ("" for none);
// lookup is called only for a state change by someone other than root, and only when control_group
// is set.
[[nodiscard]] bool may_run(control::Op op, const Peer& peer, const std::string& control_group,
                           GroupLookup lookup = group_id);

}  // namespace blkfence::daemon

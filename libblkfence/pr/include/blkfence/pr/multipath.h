// The dm-multipath maps stacked on a LU's paths, and their queueing (pr layer).
//
// A map with queue_if_no_path holds the writes it gets while it has no usable path, and sends them
// once a path is back: after the node has registered again (an acquire, a rejoin as a member), they
// land through a nexus that is registered, long after another node took over. So while a
// resource's gate is closed no map on its LUs queues: blkfenced sends the map fail_if_no_path,
// which fails what it holds and what comes while it has no path, and queue_if_no_path back once
// the gate opens again (docs/protocol.md, "Writes queued in the initiator"). The maps are found in
// sysfs (holders/ of each path's disk, recursively) and read and told through device-mapper's
// ioctls on /dev/mapper/control, which tests replace. Thread-compatible.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "blkfence/error.h"
#include "blkfence/pr/discovery.h"

namespace blkfence::pr {

struct MultipathMap {
  std::string name;  // the kernel's name, "dm-3"
  unsigned major = 0;
  unsigned minor = 0;
  bool queueing = false;  // queue_if_no_path is on now (the map's table says so)
  std::string unread;     // why its table could not be read (queueing then counts as on)
};

// device-mapper's ioctls, by device number: the table of a map (each target's type and
// parameters, DM_TABLE_STATUS with DM_STATUS_TABLE_FLAG) and a message to its target at sector 0
// (DM_TARGET_MSG).
struct DeviceMapperTarget {
  std::string type;    // "multipath", "linear", ...
  std::string params;  // the table line after the type
};
struct DeviceMapper {
  std::function<Result<std::vector<DeviceMapperTarget>>(unsigned major, unsigned minor)> table;
  std::function<Result<void>(unsigned major, unsigned minor, const std::string& message)> message;
};

// The real one: /dev/mapper/control.
DeviceMapper system_device_mapper();

// Whether a multipath target's table parameters name queue_if_no_path among its features (the
// first word counts the feature words that follow it).
[[nodiscard]] bool queues_if_no_path(const std::string& params);

// The dm-multipath maps of lu, each once, with its queueing now: those stacked on its paths (the
// holders of each path's disk, recursively; a map of one target of type multipath), and
// multipath-tools' map named by the LU's WWID ("mpath-3" and the NAA's digits) even when no path
// of it is left. Holders that are no device-mapper map (no dm/ in sysfs), or a map another tool
// named (dm/uuid other than "mpath-..." or none: LVM, dm-crypt, kpartx), are skipped unread. A map
// whose table cannot be read (suspended, going away, no CAP_SYS_ADMIN) is listed with the reason
// in unread and queueing on: it may hold writes. Fails only when sysfs cannot be read.
[[nodiscard]] Result<std::vector<MultipathMap>> multipath_maps(const LogicalUnit& lu,
                                                               const DiscoveryEnv& env,
                                                               const DeviceMapper& dm);

// Turns map's queueing on (queue_if_no_path) or off (fail_if_no_path, which also fails the writes
// it holds).
[[nodiscard]] Result<void> set_queueing(const MultipathMap& map, bool queue,
                                        const DeviceMapper& dm);

}  // namespace blkfence::pr

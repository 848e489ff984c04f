// Device discovery: from the names a user gives to the SCSI paths of each logical unit (pr layer).
//
// Accepts a LU's WWN (naa.6001405..., every path of this host to it), /dev/sdX, /dev/sgN,
// /dev/disk/by-id/... links and dm-multipath maps (/dev/dm-N,
// /dev/mapper/NAME, whose paths are the map's slaves) and groups the paths by the LU's WWN, read
// from VPD 0x83 as the kernel cached it in sysfs. Every path of a LU is its own I_T nexus and must
// be registered with the node's key (docs/protocol.md, "Resources and modes"). Reads sysfs only; no
// SCSI command is sent. The sysfs and /dev roots and stat() are replaceable so that tests can lay
// out a fake tree. Thread-compatible.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "blkfence/codec/transport_id.h"
#include "blkfence/error.h"
#include "blkfence/transport/transport.h"

namespace blkfence::pr {

// One I_T nexus to a LU as this host sees it.
struct Path {
  std::string sg;    // /dev/sgN; empty when the sg driver does not bind the device
  std::string sd;    // /dev/sdX; empty for a non-disk LU
  std::string hctl;  // host:channel:target:lun
  // The nexus's initiator port as READ FULL STATUS names it, for iSCSI: the session's initiator
  // name, its ISID left out; nullopt for other transports (tcm_loop, SAS, Fibre Channel).
  std::optional<codec::TransportId> initiator;
};

struct LogicalUnit {
  std::string wwn;          // "naa.6001405...", from VPD 0x83; "hctl:H:C:T:L" when it has none
  std::string name;         // the name the user gave first for this LU
  std::vector<Path> paths;  // in the order the user named them, multipath slaves in sysfs order
};

struct DeviceNode {
  bool is_block = false;
  bool is_char = false;
  unsigned major = 0;
  unsigned minor = 0;
};

struct DiscoveryEnv {
  std::string sysfs_root = "/sys";
  std::string dev_root = "/dev";
  // stat() of a resolved device node; replaced in tests.
  std::function<Result<DeviceNode>(const std::string& path)> stat_node;
};

// The real environment: /sys, /dev and ::stat.
DiscoveryEnv system_discovery_env();

// Resolves every name and groups the paths by LU, in the order the LUs were first named. Naming
// the same path twice (e.g. by sd and by sg) lists it once. Fails on the first name that is
// missing, not a SCSI device, or a partition, with a message naming it; a missing one (a path
// that does not exist, a WWN no device of this host has) is an OS error with ENOENT.
[[nodiscard]] Result<std::vector<LogicalUnit>> discover(const std::vector<std::string>& names,
                                                        const DiscoveryEnv& env);

// The writes this host has in flight on lu: the second field of <sysfs>/class/block/NAME/inflight
// for each path's disk and every block device stacked on it (holders/, recursively: a
// dm-multipath map, LVM), summed. A request a map sent down counts in the path's disk; one a
// request-based map holds while it has no path (queue_if_no_path) counts nowhere (the map requeues
// it, and blk-mq counts only requests on their way down): stop the map queueing first
// (multipath.h). Fails when a path's disk has no such file (it
// went away: what it had in flight is unknown), when a device counted has I/O accounting off
// (queue/iostats 0: its inflight reads 0 whatever it has), and with EBUSY while a path's SCSI
// device is blocked or quiesced or its host is in error recovery (the block layer holds commands
// unstarted, where no count sees them). Paths without a disk count nothing.
[[nodiscard]] Result<std::uint64_t> writes_in_flight(const LogicalUnit& lu,
                                                     const DiscoveryEnv& env);

// Checks that the path fd open on node reaches LU wwn (as discover() names LUs): the device the
// node belongs to now, in sysfs, must be a SCSI device with that identity. A name such as /dev/sg3
// is reused by the next device once its LU's device is gone and its last fd closed, so a name
// opened again after its device went away may reach another LU. Fails with ENODEV, naming both.
[[nodiscard]] Result<void> check_identity(const transport::DeviceNumber& node,
                                          const std::string& device, const std::string& wwn,
                                          const DiscoveryEnv& env);

}  // namespace blkfence::pr

// The host's queues of writes that blkfenced stops while a gate is closed (daemon layer).
//
// docs/protocol.md, "Writes queued in the initiator": a dm-multipath map with queue_if_no_path
// holds the writes it gets while it has no usable path and sends them once one is back, after the
// node may have registered again. fence::Resource calls set() (ResourceOptions::host_queueing):
// with queue false, every map of the LU that queues is told fail_if_no_path (what it holds fails
// at once) and remembered; with queue true, the maps it stopped are told queue_if_no_path again,
// and only those: a map the administrator set to fail is left so. What was stopped is kept in
// RUN_DIR/RESOURCE.queueing (one "MAJOR:MINOR" line per map), so that a daemon restarted
// meanwhile gives it back too. Each change is logged with its resource. One thread.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "blkfence/error.h"
#include "blkfence/pr/discovery.h"
#include "blkfence/pr/multipath.h"

namespace blkfence::daemon {

class HostQueues {
 public:
  using MapsOf = std::function<Result<std::vector<pr::MultipathMap>>(const pr::LogicalUnit& lu)>;
  HostQueues(std::string run_dir, MapsOf maps, pr::DeviceMapper dm);

  // The maps of /sys and /dev/mapper/control.
  static HostQueues system(std::string run_dir);

  // fence::ResourceOptions::host_queueing for resource. Stopping fails when a map's queueing
  // cannot be read or stopped (it may hold writes); giving back fails when a map cannot be told,
  // and keeps it remembered.
  [[nodiscard]] Result<void> set(const std::string& resource, const pr::LogicalUnit& lu,
                                 bool queue);

 private:
  std::set<std::string> stopped(const std::string& resource);
  Result<void> remember(const std::string& resource, const std::set<std::string>& maps);

  std::string run_dir_;
  MapsOf maps_;
  pr::DeviceMapper dm_;
};

}  // namespace blkfence::daemon

// The host's queues of writes that blkfenced stops while a gate is closed (daemon layer). See
// host_queues.h. One thread.
#include "host_queues.h"

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <utility>

#include "gate.h"
#include "log.h"

namespace blkfence::daemon {
namespace {

std::string number_of(const pr::MultipathMap& map) {
  return std::to_string(map.major) + ":" + std::to_string(map.minor);
}

LogFields fields_of(const std::string& resource) {
  return {.resource = resource, .key = {}, .epoch = {}, .device = {}, .message_id = {}};
}

}  // namespace

HostQueues::HostQueues(std::string run_dir, MapsOf maps, pr::DeviceMapper dm)
    : run_dir_(std::move(run_dir)), maps_(std::move(maps)), dm_(std::move(dm)) {}

HostQueues HostQueues::system(std::string run_dir) {
  pr::DeviceMapper dm = pr::system_device_mapper();
  MapsOf maps = [env = pr::system_discovery_env(), dm](const pr::LogicalUnit& lu) {
    return pr::multipath_maps(lu, env, dm);
  };
  return HostQueues(std::move(run_dir), std::move(maps), std::move(dm));
}

// The maps remembered as stopped for resource: the lines of its file.
std::set<std::string> HostQueues::stopped(const std::string& resource) {
  std::set<std::string> numbers;
  std::ifstream file(run_dir_ + "/" + resource + ".queueing");
  std::string number;
  while (file >> number) {
    numbers.insert(number);
  }
  return numbers;
}

Result<void> HostQueues::remember(const std::string& resource, const std::set<std::string>& maps) {
  const std::string path = run_dir_ + "/" + resource + ".queueing";
  if (maps.empty()) {
    if (std::remove(path.c_str()) != 0 && errno != ENOENT) {
      return tl::unexpected(Error::os(errno, "remove " + path));
    }
    return {};
  }
  std::string text;
  for (const std::string& number : maps) {
    text += number + "\n";
  }
  return replace_file(path, text);
}

Result<void> HostQueues::set(const std::string& resource, const pr::LogicalUnit& lu, bool queue) {
  auto maps = maps_(lu);
  if (!maps) {
    return tl::unexpected(maps.error());
  }
  std::set<std::string> stopped_maps = stopped(resource);
  const std::set<std::string> before = stopped_maps;
  Result<void> result;
  for (const pr::MultipathMap& map : *maps) {
    const std::string number = number_of(map);
    if (queue) {
      if (map.queueing && map.unread.empty()) {
        stopped_maps.erase(number);  // queueing already (multipathd): nothing to give back
        continue;
      }
      if (!stopped_maps.contains(number)) {
        continue;  // not stopped by blkfenced: the administrator's choice
      }
      // Stopped by blkfenced: told, even when its table cannot be read now (a suspended map), and
      // remembered until that succeeds.
    } else if (!map.queueing) {
      continue;
    } else if (map.unread.empty()) {
      // Remembered before it is told: a daemon that dies in between still gives it back. (A map
      // whose table could not be read is told, not remembered: it may not have been queueing.)
      stopped_maps.insert(number);
      if (auto kept = remember(resource, stopped_maps); !kept) {
        return kept;
      }
    }
    if (auto told = pr::set_queueing(map, queue, dm_); !told) {
      if (result) {
        result =
            tl::unexpected(map.unread.empty() ? told.error()
                                              : Error(told.error().code(),
                                                      map.unread + "; " + told.error().message()));
      }
      continue;
    }
    if (queue) {
      stopped_maps.erase(number);
    }
    log(Priority::kNotice,
        queue ? "the gate is open: " + map.name + " (" + number + ") of " + lu.name +
                    " queues writes again while it has no path (queue_if_no_path)"
              : "the gate is closed: " + map.name + " (" + number + ") of " + lu.name +
                    " no longer queues writes while it has no path (fail_if_no_path): those it "
                    "held failed" +
                    (map.unread.empty() ? "" : " (" + map.unread + ")"),
        fields_of(resource));
  }
  if (stopped_maps != before) {
    if (auto kept = remember(resource, stopped_maps); !kept) {
      return kept;
    }
  }
  return result;
}

}  // namespace blkfence::daemon

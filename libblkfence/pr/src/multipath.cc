// dm-multipath maps and their queueing (pr layer). See multipath.h. Thread-compatible.
#include "blkfence/pr/multipath.h"

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <linux/dm-ioctl.h>
#include <sys/ioctl.h>

#include "blkfence/unique_fd.h"

#include "sysfs.h"

namespace blkfence::pr {
namespace {

namespace fs = std::filesystem;

constexpr const char* kControl = "/dev/mapper/control";

// The device number in struct dm_ioctl's dev, as the kernel decodes it (huge_decode_dev).
std::uint64_t encode_dev(unsigned major, unsigned minor) {
  return (minor & 0xffU) | (static_cast<std::uint64_t>(major) << 8U) |
         (static_cast<std::uint64_t>(minor & ~0xffU) << 12U);
}

// error with context before its where, its errno kept.
Error within(const std::string& context, const Error& error) {
  return error.code() == ErrorCode::kOs ? Error::os(error.errno_value(), context + error.where())
                                        : Error(error.code(), context + error.where());
}

std::string device_name(unsigned major, unsigned minor) {
  return "device-mapper device " + std::to_string(major) + ":" + std::to_string(minor);
}

// One ioctl on the control device for the map major:minor, with a buffer of size bytes: the
// header, then payload at data_start. Grows the buffer while the kernel says it was too small.
Result<std::vector<std::byte>> dm_ioctl_call(unsigned long request, unsigned major, unsigned minor,
                                             std::uint32_t flags,
                                             const std::vector<std::byte>& payload) {
  const UniqueFd control(::open(kControl, O_RDWR | O_CLOEXEC));
  if (!control.valid()) {
    return tl::unexpected(Error::os(errno, std::string("open ") + kControl));
  }
  std::size_t size = 16384;
  for (int attempt = 0; attempt < 5; ++attempt, size *= 4) {
    std::vector<std::byte> buffer(std::max(size, sizeof(struct dm_ioctl) + payload.size()));
    struct dm_ioctl header {};
    header.version[0] = DM_VERSION_MAJOR;
    header.version[1] = 0;
    header.version[2] = 0;
    header.data_size = static_cast<std::uint32_t>(buffer.size());
    header.data_start = sizeof(struct dm_ioctl);
    header.flags = flags;
    header.dev = encode_dev(major, minor);
    std::memcpy(buffer.data(), &header, sizeof header);
    if (!payload.empty()) {
      std::memcpy(buffer.data() + sizeof header, payload.data(), payload.size());
    }
    if (::ioctl(control.get(), request, buffer.data()) != 0) {
      return tl::unexpected(Error::os(errno, device_name(major, minor)));
    }
    std::memcpy(&header, buffer.data(), sizeof header);
    if ((header.flags & DM_BUFFER_FULL_FLAG) == 0) {
      return buffer;
    }
  }
  return fail(ErrorCode::kOs, device_name(major, minor) + ": its table does not fit in 4 MiB");
}

Result<std::vector<DeviceMapperTarget>> read_table(unsigned major, unsigned minor) {
  auto buffer = dm_ioctl_call(DM_TABLE_STATUS, major, minor, DM_STATUS_TABLE_FLAG, {});
  if (!buffer) {
    return tl::unexpected(buffer.error());
  }
  struct dm_ioctl header {};
  std::memcpy(&header, buffer->data(), sizeof header);
  if ((header.flags & DM_SUSPEND_FLAG) != 0) {
    // A suspended multipath map keeps its queue_if_no_path aside until it resumes
    // (multipath_presuspend()): its table says nothing of it.
    return tl::unexpected(
        Error::os(EBUSY, device_name(major, minor) + " is suspended: its queueing cannot be read"));
  }
  std::vector<DeviceMapperTarget> targets;
  std::size_t at = header.data_start;
  for (std::uint32_t i = 0; i < header.target_count; ++i) {
    struct dm_target_spec spec {};
    if (at + sizeof spec > buffer->size()) {
      return fail(ErrorCode::kOs, device_name(major, minor) + ": its table overruns the buffer");
    }
    std::memcpy(&spec, buffer->data() + at, sizeof spec);
    DeviceMapperTarget target;
    target.type.assign(spec.target_type, strnlen(spec.target_type, sizeof spec.target_type));
    const auto* params = reinterpret_cast<const char*>(buffer->data() + at + sizeof spec);
    target.params.assign(params, strnlen(params, buffer->size() - at - sizeof spec));
    targets.push_back(std::move(target));
    // next counts from the start of the data area in a DM_TABLE_STATUS answer.
    at = header.data_start + spec.next;
  }
  return targets;
}

Result<void> send_message(unsigned major, unsigned minor, const std::string& message) {
  std::vector<std::byte> payload(sizeof(struct dm_target_msg) + message.size() + 1);
  const struct dm_target_msg head {};  // sector 0: the map's first (only) target
  std::memcpy(payload.data(), &head, sizeof head);
  std::memcpy(payload.data() + sizeof head, message.data(), message.size());
  auto sent = dm_ioctl_call(DM_TARGET_MSG, major, minor, 0, payload);
  if (!sent) {
    return tl::unexpected(within("message " + message + " to ", sent.error()));
  }
  return {};
}

// Whether a map with this dm uuid may be a multipath map: multipath-tools names its maps
// "mpath-WWID"; a map without a uuid (made by hand) may be anything. The others' tools name theirs
// ("LVM-", "CRYPT-", kpartx's "partN-"), and reading their tables would ask for CAP_SYS_ADMIN for
// nothing (dm-ioctl.c: ctl_ioctl()).
bool may_be_multipath(const std::string& uuid) {
  return uuid.empty() || uuid.starts_with("mpath-");
}

}  // namespace

DeviceMapper system_device_mapper() {
  return DeviceMapper{read_table, send_message};
}

bool queues_if_no_path(const std::string& params) {
  std::istringstream words(params);
  unsigned count = 0;
  if (!(words >> count)) {
    return false;
  }
  std::string feature;
  for (unsigned i = 0; i < count && words >> feature; ++i) {
    if (feature == "queue_if_no_path") {
      return true;
    }
  }
  return false;
}

Result<std::vector<MultipathMap>> multipath_maps(const LogicalUnit& lu, const DiscoveryEnv& env,
                                                 const DeviceMapper& dm) {
  const fs::path block = fs::path(env.sysfs_root) / "class/block";
  std::vector<std::string> pending;
  for (const Path& path : lu.paths) {
    if (!path.sd.empty()) {
      for (std::string& holder :
           sysfs::list_dir(block / fs::path(path.sd).filename() / "holders")) {
        pending.push_back(std::move(holder));
      }
    }
  }
  // multipath-tools' map of the LU by its WWID, even when none of the paths named is left (a map
  // that lost every path is the one that queues).
  if (lu.wwn.starts_with("naa.")) {
    const std::string uuid = "mpath-3" + lu.wwn.substr(4);
    for (std::string& name : sysfs::list_dir(block)) {
      if (name.starts_with("dm-") && sysfs::read_text(block / name / "dm/uuid") == uuid) {
        pending.push_back(std::move(name));
      }
    }
  }
  std::set<std::string> seen;
  std::vector<MultipathMap> maps;
  while (!pending.empty()) {
    const std::string name = pending.back();
    pending.pop_back();
    if (!seen.insert(name).second) {
      continue;  // a map over two paths of the LU is listed once
    }
    for (std::string& holder : sysfs::list_dir(block / name / "holders")) {
      pending.push_back(std::move(holder));  // a map on a map (LVM on multipath) holds nothing
    }
    std::error_code ec;
    if (!fs::exists(block / name / "dm", ec)) {
      continue;  // not a device-mapper map (md RAID, bcache): no queue of this kind
    }
    if (!may_be_multipath(sysfs::read_text(block / name / "dm/uuid"))) {
      continue;  // LVM, dm-crypt, kpartx: named by their tools, and none of them queues
    }
    MultipathMap map;
    map.name = name;
    if (std::sscanf(sysfs::read_text(block / name / "dev").c_str(), "%u:%u", &map.major,
                    &map.minor) != 2) {
      return fail(ErrorCode::kOs, "cannot read " + (block / name / "dev").string() +
                                      ": whether this map queues writes is unknown");
    }
    auto table = dm.table(map.major, map.minor);
    if (!table) {
      // Maybe a multipath map that holds writes: the caller tells it to stop all the same.
      map.queueing = true;
      map.unread = within("the table of " + name + ", ", table.error()).message();
      maps.push_back(std::move(map));
      continue;
    }
    if (table->size() != 1 || table->front().type != "multipath") {
      continue;  // linear, striped, crypt...: they pass writes on and hold none back
    }
    map.queueing = queues_if_no_path(table->front().params);
    maps.push_back(std::move(map));
  }
  return maps;
}

Result<void> set_queueing(const MultipathMap& map, bool queue, const DeviceMapper& dm) {
  auto sent = dm.message(map.major, map.minor, queue ? "queue_if_no_path" : "fail_if_no_path");
  if (!sent) {
    return tl::unexpected(within(map.name + ": ", sent.error()));
  }
  return {};
}

}  // namespace blkfence::pr

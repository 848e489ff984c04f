// Device discovery through sysfs (pr layer). See discovery.h. Thread-compatible.
#include "blkfence/pr/discovery.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <optional>
#include <set>
#include <system_error>

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "blkfence/codec/inquiry.h"

#include "sysfs.h"

namespace blkfence::pr {
namespace {

namespace fs = std::filesystem;
using sysfs::list_dir;
using sysfs::read_file;
using sysfs::read_text;

constexpr unsigned kScsiGenericMajor = 21;  // Documentation/admin-guide/devices.txt

Result<fs::path> canonical(const fs::path& path, const std::string& what) {
  std::error_code ec;
  fs::path resolved = fs::canonical(path, ec);
  if (ec) {
    return tl::unexpected(Error::os(ec.value(), what));
  }
  return resolved;
}

bool is_scsi_device(const fs::path& device_dir) {
  std::error_code ec;
  const fs::path subsystem = fs::read_symlink(device_dir / "subsystem", ec);
  return !ec && subsystem.filename() == "scsi";
}

// The WWN the kernel cached from VPD 0x83 (drivers/scsi/scsi.c: scsi_attach_vpd()), else the wwid
// attribute (sd's own pick), else the path itself: an LU without a designator cannot be grouped.
std::string lu_identity(const fs::path& device_dir, const std::string& hctl) {
  const std::string raw = read_file(device_dir / "vpd_pg83");
  const std::vector<std::uint8_t> page(raw.begin(), raw.end());
  if (auto identification = codec::decode_vpd_device_identification(page)) {
    if (auto wwn = codec::lu_wwn(*identification)) {
      return *wwn;
    }
  }
  if (std::string wwid = read_text(device_dir / "wwid"); !wwid.empty()) {
    return wwid;
  }
  return "hctl:" + hctl;
}

struct ResolvedPath {
  Path path;
  std::string wwn;
};

// The initiator port of the nexus whose SCSI device sysfs has at device_dir (canonical:
// /sys/devices/.../hostH/sessionS/targetH:C:T/H:C:T:L for iSCSI): the session's initiator name,
// which every session of the host shares unless an iface sets its own, so a registration made
// through a session since gone still counts as this host's. Fibre Channel is left out: each HBA
// port has its own name, and a registration made through a port whose paths are all gone would
// count as another node's (docs/protocol.md, "Identical keys").
std::optional<codec::TransportId> initiator_of(const fs::path& device_dir,
                                               const DiscoveryEnv& env) {
  std::error_code ec;
  const fs::path devices = fs::weakly_canonical(fs::path(env.sysfs_root) / "devices", ec);
  for (const fs::path& part : device_dir.lexically_relative(devices)) {
    if (part.string().starts_with("session")) {
      std::string name =
          read_text(fs::path(env.sysfs_root) / "class/iscsi_session" / part / "initiatorname");
      return name.empty() ? std::nullopt
                          : std::optional(codec::iscsi_transport_id(std::move(name)));
    }
  }
  return std::nullopt;
}

Result<ResolvedPath> path_of_scsi_device(const fs::path& device_dir, const DiscoveryEnv& env,
                                         const std::string& name) {
  if (!is_scsi_device(device_dir)) {
    return fail(ErrorCode::kInvalidArgument,
                name +
                    ": not a SCSI device (persistent reservations need SCSI; NVMe is not "
                    "supported yet)");
  }
  const auto resolved = canonical(device_dir, name);
  if (!resolved) {
    return tl::unexpected(resolved.error());
  }
  ResolvedPath result;
  result.path.hctl = resolved->filename().string();
  if (const auto block = list_dir(*resolved / "block"); !block.empty()) {
    result.path.sd = env.dev_root + "/" + block.front();
  }
  if (const auto sg = list_dir(*resolved / "scsi_generic"); !sg.empty()) {
    result.path.sg = env.dev_root + "/" + sg.front();
  }
  result.path.initiator = initiator_of(*resolved, env);
  result.wwn = lu_identity(*resolved, result.path.hctl);
  return result;
}

// A designator as the kernel names it (naa., eui., t10., or the SCSI name string of VPD 0x83).
bool is_wwn(const std::string& name) {
  for (const char* prefix : {"naa.", "eui.", "t10.", "iqn.", "name."}) {
    if (name.starts_with(prefix)) {
      return true;
    }
  }
  return false;
}

// Every SCSI device of this host whose LU has the WWN, each one path (I_T nexus) to it.
Result<std::vector<ResolvedPath>> resolve_wwn(const std::string& wwn, const DiscoveryEnv& env) {
  const fs::path devices = fs::path(env.sysfs_root) / "class/scsi_device";
  std::vector<ResolvedPath> paths;
  for (const auto& hctl : list_dir(devices)) {
    const fs::path device_dir = devices / hctl / "device";
    if (lu_identity(device_dir, hctl) != wwn) {
      continue;
    }
    std::string what = wwn;
    what += " (path ";
    what += hctl;
    what += ")";
    auto path = path_of_scsi_device(device_dir, env, what);
    if (!path) {
      return tl::unexpected(path.error());
    }
    paths.push_back(std::move(*path));
  }
  if (paths.empty()) {
    // ENOENT, as for a device path that does not exist: the LU may appear later (a login).
    return tl::unexpected(
        Error::os(ENOENT, wwn + ": no SCSI device of this host has this WWN (is the target logged "
                                "in? see 'lsscsi -i' or /dev/disk/by-id/wwn-*)"));
  }
  return paths;
}

Result<std::vector<ResolvedPath>> resolve(const std::string& name, const DiscoveryEnv& env) {
  if (is_wwn(name)) {
    return resolve_wwn(name, env);
  }
  const auto node_path = canonical(name, name + ": no such device");
  if (!node_path) {
    return tl::unexpected(node_path.error());
  }
  const auto node = env.stat_node(node_path->string());
  if (!node) {
    return tl::unexpected(node.error());
  }
  const fs::path sys(env.sysfs_root);
  const std::string dev = std::to_string(node->major) + ":" + std::to_string(node->minor);

  if (node->is_char) {
    if (node->major != kScsiGenericMajor) {
      return fail(ErrorCode::kInvalidArgument,
                  name + ": a character device that is not SCSI generic (/dev/sgN)");
    }
    const auto sg_dir = canonical(sys / "dev/char" / dev, name + ": no sysfs entry for sg " + dev);
    if (!sg_dir) {
      return tl::unexpected(sg_dir.error());
    }
    auto path = path_of_scsi_device(*sg_dir / "device", env, name);
    if (!path) {
      return tl::unexpected(path.error());
    }
    return std::vector<ResolvedPath>{*path};
  }
  if (!node->is_block) {
    return fail(ErrorCode::kInvalidArgument, name + ": not a block or SCSI generic device");
  }

  const auto block_dir = canonical(sys / "dev/block" / dev, name + ": no sysfs entry for " + dev);
  if (!block_dir) {
    return tl::unexpected(block_dir.error());
  }
  if (fs::exists(*block_dir / "partition")) {
    return fail(ErrorCode::kInvalidArgument,
                name +
                    ": a partition; persistent reservations apply to the whole LU, name the "
                    "disk (" +
                    block_dir->parent_path().filename().string() + ")");
  }
  if (!fs::exists(*block_dir / "dm")) {
    auto path = path_of_scsi_device(*block_dir / "device", env, name);
    if (!path) {
      return tl::unexpected(path.error());
    }
    return std::vector<ResolvedPath>{*path};
  }

  // A device-mapper map: its paths are its slaves (dm-multipath). Anything stacked deeper, such as
  // LVM on multipath, has dm slaves and is refused: reserve the multipath map itself.
  const auto slaves = list_dir(*block_dir / "slaves");
  if (slaves.empty()) {
    return fail(ErrorCode::kInvalidArgument, name + ": a device-mapper device without paths");
  }
  std::vector<ResolvedPath> paths;
  for (const auto& slave : slaves) {
    const fs::path slave_dir = sys / "class/block" / slave;
    if (fs::exists(slave_dir / "dm")) {
      std::string message = name;
      message += ": stacked on device-mapper device ";
      message += slave;
      message += "; name the multipath map of the shared LU instead";
      return fail(ErrorCode::kInvalidArgument, std::move(message));
    }
    std::string what = name;
    what += " (path ";
    what += slave;
    what += ")";
    auto path = path_of_scsi_device(slave_dir / "device", env, what);
    if (!path) {
      return tl::unexpected(path.error());
    }
    paths.push_back(std::move(*path));
  }
  return paths;
}

}  // namespace

DiscoveryEnv system_discovery_env() {
  DiscoveryEnv env;
  env.stat_node = [](const std::string& path) -> Result<DeviceNode> {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      return tl::unexpected(Error::os(errno, path));
    }
    return DeviceNode{.is_block = S_ISBLK(st.st_mode),
                      .is_char = S_ISCHR(st.st_mode),
                      .major = major(st.st_rdev),
                      .minor = minor(st.st_rdev)};
  };
  return env;
}

Result<std::vector<LogicalUnit>> discover(const std::vector<std::string>& names,
                                          const DiscoveryEnv& env) {
  std::vector<LogicalUnit> lus;
  for (const auto& name : names) {
    auto paths = resolve(name, env);
    if (!paths) {
      return tl::unexpected(paths.error());
    }
    for (auto& resolved : *paths) {
      auto lu = std::find_if(lus.begin(), lus.end(),
                             [&](const LogicalUnit& l) { return l.wwn == resolved.wwn; });
      if (lu == lus.end()) {
        lus.push_back(LogicalUnit{.wwn = resolved.wwn, .name = name, .paths = {}});
        lu = std::prev(lus.end());
      }
      const bool known = std::any_of(lu->paths.begin(), lu->paths.end(),
                                     [&](const Path& p) { return p.hctl == resolved.path.hctl; });
      if (!known) {
        lu->paths.push_back(std::move(resolved.path));
      }
    }
  }
  return lus;
}

namespace {

// The write count of /sys/class/block/NAME/inflight ("READS WRITES"), or nothing when it cannot be
// read or parsed.
std::optional<std::uint64_t> inflight_writes(const fs::path& block_dir) {
  const std::string text = read_text(block_dir / "inflight");
  unsigned long long reads = 0;
  unsigned long long writes = 0;
  char extra = 0;
  if (std::sscanf(text.c_str(), "%llu %llu %c", &reads, &writes, &extra) != 2) {
    return std::nullopt;
  }
  return writes;
}

// Why the SCSI layer may hold commands of path unstarted, where no count sees them, or "" when it
// holds none: its device blocked (an iSCSI session in recovery, a Fibre Channel remote port that
// went away: until the transport is back or gives up) or quiesced, or its host in error recovery
// (nothing new is started on it until the error handler is done).
std::string held_back(const Path& path, const DiscoveryEnv& env) {
  const std::string state =
      read_text(fs::path(env.sysfs_root) / "class/scsi_device" / path.hctl / "device/state");
  if (state == "blocked" || state == "created-blocked" || state == "quiesce") {
    return "its SCSI device " + path.hctl + " is " + state +
           " (an iSCSI session or a Fibre Channel port in recovery)";
  }
  const std::string host = path.hctl.substr(0, path.hctl.find(':'));
  const std::string host_state =
      read_text(fs::path(env.sysfs_root) / "class/scsi_host" / ("host" + host) / "state");
  if (host_state.find("recovery") != std::string::npos) {
    return "its SCSI host host" + host + " is in error recovery";
  }
  return {};
}

}  // namespace

Result<std::uint64_t> writes_in_flight(const LogicalUnit& lu, const DiscoveryEnv& env) {
  const fs::path block = fs::path(env.sysfs_root) / "class/block";
  std::vector<std::string> pending;
  for (const Path& path : lu.paths) {
    if (path.sd.empty()) {
      continue;
    }
    if (const std::string why = held_back(path, env); !why.empty()) {
      return tl::unexpected(
          Error::os(EBUSY, path.sd + " may hold writes that no count shows: " + why));
    }
    pending.push_back(fs::path(path.sd).filename().string());
  }
  std::set<std::string> seen;
  std::uint64_t total = 0;
  while (!pending.empty()) {
    const std::string name = pending.back();
    pending.pop_back();
    if (!seen.insert(name).second) {
      continue;  // a map over two paths of the LU is counted once
    }
    const auto writes = inflight_writes(block / name);
    if (!writes) {
      return fail(ErrorCode::kOs, "cannot read " + (block / name / "inflight").string() +
                                      " (the device went away?): its writes in flight are unknown");
    }
    // blk-mq counts a request in inflight only when the queue accounts I/O (blk_do_io_stat():
    // RQF_IO_STAT is set from queue/iostats), and device-mapper likewise: with it off, 0 means
    // nothing.
    if (read_text(block / name / "queue/iostats") == "0") {
      return fail(ErrorCode::kNotSupported,
                  "I/O accounting is off, so the writes in flight cannot be counted: " +
                      (block / name / "queue/iostats").string() + " is 0 (write 1 to it)");
    }
    // A suspended device-mapper map (multipathd reloading its table, an LVM change) holds what
    // comes to it unstarted, where its inflight does not count it.
    if (read_text(block / name / "dm/suspended") == "1") {
      return tl::unexpected(Error::os(
          EBUSY, "/dev/" + name + " may hold writes that no count shows: it is suspended"));
    }
    total += *writes;
    for (std::string& holder : list_dir(block / name / "holders")) {
      pending.push_back(std::move(holder));
    }
  }
  return total;
}

Result<void> check_identity(const transport::DeviceNumber& node, const std::string& device,
                            const std::string& wwn, const DiscoveryEnv& env) {
  const fs::path link = fs::path(env.sysfs_root) / "dev" / (node.is_char ? "char" : "block") /
                        (std::to_string(node.major) + ":" + std::to_string(node.minor)) / "device";
  std::error_code ec;
  const fs::path device_dir = fs::canonical(link, ec);
  if (ec || !is_scsi_device(device_dir)) {
    return tl::unexpected(Error::os(
        ENODEV, device + ": its SCSI device is gone (" + link.string() + "); expected LU " + wwn));
  }
  if (std::string now = lu_identity(device_dir, device_dir.filename().string()); now != wwn) {
    return tl::unexpected(Error::os(ENODEV, device + " is LU " + now + " now, not LU " + wwn +
                                                " (the name was reused after the LU's device "
                                                "went away): nothing is sent through it"));
  }
  return {};
}

}  // namespace blkfence::pr

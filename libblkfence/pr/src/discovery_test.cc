// Proves discovery on a fake sysfs tree laid out as Linux 6.1 does: sd and sg names of one nexus
// are one path, nexuses with the same WWN are one LU, a dm-multipath map yields its slaves,
// /dev/disk/by-id links resolve, and partitions, missing devices and non-SCSI devices are refused
// with a message naming them.
#include "blkfence/pr/discovery.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include <gtest/gtest.h>
#include <unistd.h>

#include "blkfence/pr/multipath.h"

namespace blkfence::pr {
namespace {

namespace fs = std::filesystem;

// VPD 0x83 with one NAA IEEE Registered Extended designator (LU association), as LIO sends it.
std::vector<std::uint8_t> vpd83_naa(std::uint8_t last_byte) {
  std::vector<std::uint8_t> page{0x00, 0x83, 0x00, 0x14, 0x01, 0x03, 0x00, 0x10,
                                 0x60, 0x01, 0x40, 0x5b, 0x1f, 0x0c, 0xe0, 0x00,
                                 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, last_byte};
  return page;
}

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("blkfence-discovery-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "sys/bus/scsi");
    fs::create_directories(root_ / "sys/bus/nvme");
    fs::create_directories(root_ / "dev/disk/by-id");
    env_.sysfs_root = (root_ / "sys").string();
    env_.dev_root = (root_ / "dev").string();
    env_.stat_node = [this](const std::string& path) -> Result<DeviceNode> {
      const auto it = nodes_.find(fs::path(path).filename().string());
      if (it == nodes_.end()) {
        return fail(ErrorCode::kOs, path + ": not a device node");
      }
      return it->second;
    };
  }
  void TearDown() override { fs::remove_all(root_); }

  // A SCSI device H:C:T:L with sd and sg nodes and a VPD 0x83 page.
  // between: the directories between the host's and the device's (an iSCSI session, an FC rport).
  void add_scsi_disk(const std::string& hctl, const std::string& sd, unsigned sd_minor,
                     const std::string& sg, unsigned sg_minor, std::uint8_t wwn_last_byte,
                     const std::string& between = {}) {
    const fs::path dev =
        root_ / "sys/devices/platform" / ("host" + hctl.substr(0, 1)) / between / hctl;
    fs::create_directories(dev / "block" / sd);
    fs::create_directories(dev / "scsi_generic" / sg);
    fs::create_directory_symlink(root_ / "sys/bus/scsi", dev / "subsystem");
    fs::create_directory_symlink(dev, dev / "block" / sd / "device");
    fs::create_directory_symlink(dev, dev / "scsi_generic" / sg / "device");
    std::ofstream(dev / "vpd_pg83", std::ios::binary)
        .write(reinterpret_cast<const char*>(vpd83_naa(wwn_last_byte).data()), 24);
    link_dev("block", 8, sd_minor, dev / "block" / sd);
    link_dev("char", 21, sg_minor, dev / "scsi_generic" / sg);
    fs::create_directories(root_ / "sys/class/block");
    fs::create_directory_symlink(dev / "block" / sd, root_ / "sys/class/block" / sd);
    fs::create_directories(root_ / "sys/class/scsi_device" / hctl);
    fs::create_directory_symlink(dev, root_ / "sys/class/scsi_device" / hctl / "device");
    add_node(sd, true, 8, sd_minor);
    add_node(sg, false, 21, sg_minor);
  }

  void link_dev(const std::string& kind, unsigned major, unsigned minor, const fs::path& target) {
    fs::create_directories(root_ / "sys/dev" / kind);
    fs::create_directory_symlink(
        target, root_ / "sys/dev" / kind / (std::to_string(major) + ":" + std::to_string(minor)));
  }

  void add_node(const std::string& name, bool block, unsigned major, unsigned minor) {
    std::ofstream(root_ / "dev" / name).put('\0');
    nodes_[name] = DeviceNode{.is_block = block, .is_char = !block, .major = major, .minor = minor};
  }

  std::string dev(const std::string& name) const { return (root_ / "dev" / name).string(); }

  // A block device holder (a device-mapper map when minor is given: dm/ and dev in sysfs) stacked
  // on the devices below.
  void stack(const std::string& holder, const std::vector<std::string>& below,
             std::optional<unsigned> minor = std::nullopt) {
    const fs::path dir = root_ / "sys/devices/virtual/block" / holder;
    fs::create_directories(dir / "holders");
    fs::create_directory_symlink(dir, root_ / "sys/class/block" / holder);
    for (const auto& name : below) {
      fs::create_directories(root_ / "sys/class/block" / name / "holders");
      fs::create_directory_symlink(dir, root_ / "sys/class/block" / name / "holders" / holder);
    }
    if (minor) {
      fs::create_directories(dir / "dm");
      std::ofstream(dir / "dev") << "253:" << *minor << "\n";
    }
  }

  fs::path root_;
  DiscoveryEnv env_;
  std::map<std::string, DeviceNode> nodes_;
};

TEST_F(FakeSysfs, SdAndSgOfOneNexusAreOnePath) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x01);
  const auto lus = discover({dev("sda"), dev("sg0")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ(lus->size(), 1U);
  EXPECT_EQ((*lus)[0].wwn, "naa.6001405b1f0ce0000000000000000001");
  EXPECT_EQ((*lus)[0].name, dev("sda"));
  ASSERT_EQ((*lus)[0].paths.size(), 1U);
  EXPECT_EQ((*lus)[0].paths[0].sd, dev("sda"));
  EXPECT_EQ((*lus)[0].paths[0].sg, dev("sg0"));
  EXPECT_EQ((*lus)[0].paths[0].hctl, "0:0:1:0");
}

TEST_F(FakeSysfs, NexusesWithOneWwnAreOneLuAndOthersStayApart) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x01);
  add_scsi_disk("1:0:1:0", "sdb", 16, "sg1", 1, 0x01);
  add_scsi_disk("1:0:1:1", "sdc", 32, "sg2", 2, 0x02);
  const auto lus = discover({dev("sg0"), dev("sdc"), dev("sdb")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ(lus->size(), 2U);
  EXPECT_EQ((*lus)[0].paths.size(), 2U);
  EXPECT_EQ((*lus)[0].paths[1].hctl, "1:0:1:0");
  EXPECT_EQ((*lus)[1].wwn, "naa.6001405b1f0ce0000000000000000002");
  EXPECT_EQ((*lus)[1].paths.size(), 1U);
}

TEST_F(FakeSysfs, AWwnNamesEveryPathOfThisHostToTheLu) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x01);
  add_scsi_disk("1:0:1:0", "sdb", 16, "sg1", 1, 0x01);
  add_scsi_disk("1:0:1:1", "sdc", 32, "sg2", 2, 0x02);
  const auto lus = discover({"naa.6001405b1f0ce0000000000000000001"}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ(lus->size(), 1U);
  EXPECT_EQ((*lus)[0].name, "naa.6001405b1f0ce0000000000000000001");
  ASSERT_EQ((*lus)[0].paths.size(), 2U);
  EXPECT_EQ((*lus)[0].paths[0].sg, dev("sg0"));
  EXPECT_EQ((*lus)[0].paths[1].sg, dev("sg1"));

  const auto missing = discover({"naa.6001405b1f0ce0000000000000000009"}, env_);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message().find("no SCSI device of this host has this WWN"),
            std::string::npos);
  // Absent, as a missing device path is: blkfenced waits for it instead of refusing to start.
  EXPECT_EQ(missing.error().code(), ErrorCode::kOs);
  EXPECT_EQ(missing.error().errno_value(), ENOENT);
}

TEST_F(FakeSysfs, MultipathMapYieldsItsSlaves) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x07);
  add_scsi_disk("1:0:1:0", "sdb", 16, "sg1", 1, 0x07);
  const fs::path dm = root_ / "sys/devices/virtual/block/dm-0";
  fs::create_directories(dm / "dm");
  fs::create_directories(dm / "slaves");
  fs::create_directory_symlink(root_ / "sys/class/block/sda", dm / "slaves/sda");
  fs::create_directory_symlink(root_ / "sys/class/block/sdb", dm / "slaves/sdb");
  link_dev("block", 254, 0, dm);
  add_node("dm-0", true, 254, 0);
  fs::create_directories(root_ / "dev/mapper");
  fs::create_symlink("../dm-0", root_ / "dev/mapper/pgdata");

  const auto lus = discover({dev("mapper/pgdata")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ(lus->size(), 1U);
  ASSERT_EQ((*lus)[0].paths.size(), 2U);
  EXPECT_EQ((*lus)[0].paths[0].sg, dev("sg0"));
  EXPECT_EQ((*lus)[0].paths[1].sg, dev("sg1"));
}

// Before a re-key of its own holding nexus the daemon waits for the node's writes on the LU
// (docs/protocol.md, "Re-keying a holding nexus"): each path's disk and every device stacked on
// it (a multipath map over both, LVM on the map) count once; reads do not count; a disk that went
// away is an error, never zero.
TEST_F(FakeSysfs, WritesInFlightSumThePathsAndEveryDeviceStackedOnThem) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x07);
  add_scsi_disk("1:0:1:0", "sdb", 16, "sg1", 1, 0x07);
  const auto set_inflight = [&](const std::string& name, const std::string& text) {
    std::ofstream(root_ / "sys/class/block" / name / "inflight") << text;
  };
  stack("dm-0", {"sda", "sdb"});  // the multipath map
  stack("dm-1", {"dm-0"});        // a logical volume on it
  set_inflight("sda", "       5        2\n");
  set_inflight("sdb", "       0        1\n");
  set_inflight("dm-0", "       3        4\n");
  set_inflight("dm-1", "       0        8\n");
  const auto lus = discover({dev("sda"), dev("sdb")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ(lus->size(), 1U);
  const auto writes = writes_in_flight((*lus)[0], env_);
  ASSERT_TRUE(writes.has_value()) << writes.error().message();
  EXPECT_EQ(*writes, 2U + 1U + 4U + 8U);

  set_inflight("dm-1", "       0        0\n");
  set_inflight("dm-0", "       0        0\n");
  set_inflight("sda", "       7        0\n");
  set_inflight("sdb", "       0        0\n");
  EXPECT_EQ(writes_in_flight((*lus)[0], env_).value_or(99), 0U);

  // With I/O accounting off, a device's inflight says 0 whatever it has in flight: refused.
  const auto set_iostats = [&](const std::string& name, const std::string& text) {
    fs::create_directories(root_ / "sys/class/block" / name / "queue");
    std::ofstream(root_ / "sys/class/block" / name / "queue/iostats") << text;
  };
  set_iostats("sda", "1\n");
  set_iostats("dm-1", "0\n");
  const auto uncounted = writes_in_flight((*lus)[0], env_);
  ASSERT_FALSE(uncounted.has_value());
  EXPECT_NE(uncounted.error().message().find("dm-1/queue/iostats is 0"), std::string::npos)
      << uncounted.error().message();
  set_iostats("dm-1", "1\n");
  EXPECT_EQ(writes_in_flight((*lus)[0], env_).value_or(99), 0U);

  fs::remove(root_ / "sys/class/block/sdb/inflight");
  const auto gone = writes_in_flight((*lus)[0], env_);
  ASSERT_FALSE(gone.has_value());
  EXPECT_NE(gone.error().message().find("sdb/inflight"), std::string::npos);
}

// A blocked SCSI device (an iSCSI session in recovery), a quiesced one, and a host in error
// recovery hold commands in the block layer unstarted, where inflight does not count them
// (docs/protocol.md, "Writes queued in the initiator"): the count fails with EBUSY, naming the
// path and why, until the device runs again and its host is out of recovery.
TEST_F(FakeSysfs, WritesInFlightAreUnknownWhileAPathHoldsCommandsBack) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x07);
  add_scsi_disk("1:0:1:0", "sdb", 16, "sg1", 1, 0x07);
  for (const char* sd : {"sda", "sdb"}) {
    std::ofstream(root_ / "sys/class/block" / sd / "inflight") << "       0        0\n";
  }
  const auto set_state = [&](const std::string& hctl, const std::string& state) {
    std::ofstream(root_ / "sys/class/scsi_device" / hctl / "device/state") << state << "\n";
  };
  const auto set_host_state = [&](const std::string& host, const std::string& state) {
    fs::create_directories(root_ / "sys/class/scsi_host" / host);
    std::ofstream(root_ / "sys/class/scsi_host" / host / "state") << state << "\n";
  };
  set_state("0:0:1:0", "running");
  set_state("1:0:1:0", "running");
  set_host_state("host0", "running");
  set_host_state("host1", "running");
  const auto lus = discover({dev("sda"), dev("sdb")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ(lus->size(), 1U);
  EXPECT_EQ(writes_in_flight((*lus)[0], env_).value_or(99), 0U);

  for (const char* state : {"blocked", "created-blocked", "quiesce"}) {
    set_state("1:0:1:0", state);
    const auto held = writes_in_flight((*lus)[0], env_);
    ASSERT_FALSE(held.has_value()) << state;
    EXPECT_EQ(held.error().errno_value(), EBUSY);
    EXPECT_NE(held.error().message().find(dev("sdb") +
                                          " may hold writes that no count shows: its "
                                          "SCSI device 1:0:1:0 is " +
                                          state),
              std::string::npos)
        << held.error().message();
  }
  // Offline and transport-offline devices fail what they hold and what comes: nothing waits.
  for (const char* state : {"offline", "transport-offline", "running"}) {
    set_state("1:0:1:0", state);
    EXPECT_EQ(writes_in_flight((*lus)[0], env_).value_or(99), 0U) << state;
  }
  set_host_state("host0", "recovery");
  const auto recovering = writes_in_flight((*lus)[0], env_);
  ASSERT_FALSE(recovering.has_value());
  EXPECT_NE(recovering.error().message().find("its SCSI host host0 is in error recovery"),
            std::string::npos)
      << recovering.error().message();
  set_host_state("host0", "running");
  EXPECT_EQ(writes_in_flight((*lus)[0], env_).value_or(99), 0U);

  // A suspended device-mapper map on the paths holds what comes to it unstarted too.
  stack("dm-0", {"sda", "sdb"}, 0);
  std::ofstream(root_ / "sys/class/block/dm-0/inflight") << "       0        0\n";
  std::ofstream(root_ / "sys/class/block/dm-0/dm/suspended") << "1\n";
  const auto suspended = writes_in_flight((*lus)[0], env_);
  ASSERT_FALSE(suspended.has_value());
  EXPECT_EQ(suspended.error().errno_value(), EBUSY);
  EXPECT_NE(suspended.error().message().find("/dev/dm-0 may hold writes that no count shows: it "
                                             "is suspended"),
            std::string::npos)
      << suspended.error().message();
  std::ofstream(root_ / "sys/class/block/dm-0/dm/suspended") << "0\n";
  EXPECT_EQ(writes_in_flight((*lus)[0], env_).value_or(99), 0U);
}

// What a path's fd reaches is checked by its device number: sg and sd of the LU pass; once the LU's
// device is gone and another took its minors, the same numbers name the other LU and fail, naming
// both; with no device behind the numbers at all, they fail too. All with ENODEV.
TEST_F(FakeSysfs, CheckIdentityFollowsTheDeviceNumberNotTheName) {
  add_scsi_disk("2:0:0:0", "sda", 0, "sg0", 0, 0x11);
  const auto lus = discover({dev("sg0")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  const std::string wwn = (*lus)[0].wwn;
  const transport::DeviceNumber sg0{.is_char = true, .major = 21, .minor = 0};
  const transport::DeviceNumber sda{.is_char = false, .major = 8, .minor = 0};
  EXPECT_TRUE(check_identity(sg0, dev("sg0"), wwn, env_).has_value());
  EXPECT_TRUE(check_identity(sda, dev("sda"), wwn, env_).has_value());

  fs::remove_all(root_ / "sys/devices/platform/host2/2:0:0:0");
  fs::remove(root_ / "sys/dev/char/21:0");
  fs::remove(root_ / "sys/dev/block/8:0");
  fs::remove(root_ / "sys/class/block/sda");
  fs::remove_all(root_ / "sys/class/scsi_device/2:0:0:0");
  const auto gone = check_identity(sg0, dev("sg0"), wwn, env_);
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().errno_value(), ENODEV);
  EXPECT_NE(gone.error().message().find("its SCSI device is gone"), std::string::npos)
      << gone.error().message();

  add_scsi_disk("2:0:1:0", "sda", 0, "sg0", 0, 0x22);
  const auto other = discover({dev("sg0")}, env_);
  ASSERT_TRUE(other.has_value()) << other.error().message();
  ASSERT_NE((*other)[0].wwn, wwn);
  const auto reused = check_identity(sg0, dev("sg0"), wwn, env_);
  ASSERT_FALSE(reused.has_value());
  EXPECT_EQ(reused.error().errno_value(), ENODEV);
  EXPECT_NE(reused.error().message().find(dev("sg0") + " is LU " + (*other)[0].wwn +
                                          " now, not LU " + wwn),
            std::string::npos)
      << reused.error().message();
  EXPECT_FALSE(check_identity(sda, dev("sda"), wwn, env_).has_value());
}

TEST_F(FakeSysfs, ByIdLinkResolves) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x03);
  fs::create_symlink("../../sda", root_ / "dev/disk/by-id/wwn-0x6001405b1f0ce0000000000000000003");
  const auto lus = discover({dev("disk/by-id/wwn-0x6001405b1f0ce0000000000000000003")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ(lus->size(), 1U);
  EXPECT_EQ((*lus)[0].paths[0].sd, dev("sda"));
}

TEST_F(FakeSysfs, WithoutVpd83TheWwidAttributeIdentifiesTheLu) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x03);
  const fs::path device = root_ / "sys/devices/platform/host0/0:0:1:0";
  fs::remove(device / "vpd_pg83");
  std::ofstream(device / "wwid") << "t10.LIO-ORG   lu0\n";
  const auto lus = discover({dev("sda")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  EXPECT_EQ((*lus)[0].wwn, "t10.LIO-ORG   lu0");
}

TEST_F(FakeSysfs, RefusesPartitionsMissingAndNonScsiDevices) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x01);
  const fs::path part = root_ / "sys/devices/platform/host0/0:0:1:0/block/sda/sda1";
  fs::create_directories(part);
  std::ofstream(part / "partition") << "1\n";
  link_dev("block", 8, 1, part);
  add_node("sda1", true, 8, 1);
  const auto partition = discover({dev("sda1")}, env_);
  ASSERT_FALSE(partition.has_value());
  EXPECT_NE(partition.error().where().find("partition"), std::string::npos);
  EXPECT_NE(partition.error().where().find("sda1"), std::string::npos);

  const auto missing = discover({dev("sdz")}, env_);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), ErrorCode::kOs);
  EXPECT_EQ(missing.error().errno_value(), ENOENT);
  EXPECT_NE(missing.error().message().find("sdz"), std::string::npos);

  const fs::path nvme = root_ / "sys/devices/pci0000:00/nvme0";
  fs::create_directories(nvme / "block/nvme0n1");
  fs::create_directory_symlink(root_ / "sys/bus/nvme", nvme / "subsystem");
  fs::create_directory_symlink(nvme, nvme / "block/nvme0n1/device");
  link_dev("block", 259, 0, nvme / "block/nvme0n1");
  add_node("nvme0n1", true, 259, 0);
  const auto not_scsi = discover({dev("nvme0n1")}, env_);
  ASSERT_FALSE(not_scsi.has_value());
  EXPECT_NE(not_scsi.error().where().find("not a SCSI device"), std::string::npos);

  add_node("tty0", false, 4, 0);
  const auto tty = discover({dev("tty0")}, env_);
  ASSERT_FALSE(tty.has_value());
  EXPECT_NE(tty.error().where().find("not SCSI generic"), std::string::npos);
}

// docs/protocol.md, "Identical keys": each iSCSI path's initiator port as READ FULL STATUS names
// it, the session's initiator name; none for the other transports (Fibre Channel, whose host
// names its port, included: a port with no path left would count as another's).
TEST_F(FakeSysfs, EachIscsiPathKnowsItsInitiatorPort) {
  add_scsi_disk("3:0:0:1", "sdd", 48, "sg3", 3, 0x07, "session3/target3:0:0");
  fs::create_directories(root_ / "sys/class/iscsi_session/session3");
  std::ofstream(root_ / "sys/class/iscsi_session/session3/initiatorname")
      << "iqn.2026-11.org.example:db1\n";
  add_scsi_disk("4:0:0:1", "sde", 64, "sg4", 4, 0x07, "rport-4:0-0/target4:0:0");
  fs::create_directories(root_ / "sys/class/fc_host/host4");
  std::ofstream(root_ / "sys/class/fc_host/host4/port_name") << "0x21000024ff3dcb1e\n";
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x07);
  const auto lus = discover({dev("sdd"), dev("sde"), dev("sda")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ(lus->size(), 1U);
  const auto& paths = (*lus)[0].paths;
  ASSERT_EQ(paths.size(), 3U);
  EXPECT_EQ(paths[0].initiator, codec::iscsi_transport_id("iqn.2026-11.org.example:db1"));
  EXPECT_EQ(paths[1].initiator, std::nullopt);
  EXPECT_EQ(paths[2].initiator, std::nullopt);
}

// A multipath map with queue_if_no_path holds writes across a fence (docs/protocol.md, "Writes
// queued in the initiator"): the maps of a LU are the dm-multipath holders of its paths, each
// once, with their queueing as the table says; a logical volume on the map, a map of another LU
// and a holder that is no device-mapper map are none of them, and a map LVM named is not even
// read (reading a table needs CAP_SYS_ADMIN).
TEST_F(FakeSysfs, MultipathMapsAreTheMultipathHoldersOfTheLusPathsEachOnce) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x07);
  add_scsi_disk("1:0:1:0", "sdb", 16, "sg1", 1, 0x07);
  add_scsi_disk("1:0:1:1", "sdc", 32, "sg2", 2, 0x08);
  stack("dm-0", {"sda", "sdb"}, 0);  // the LU's map
  stack("dm-1", {"dm-0"}, 1);        // a logical volume on it
  stack("md0", {"sdb"});             // not device-mapper
  stack("dm-2", {"sdc"}, 2);         // another LU's map
  stack("dm-5", {"sda"}, 5);         // a logical volume straight on the path: LVM names it
  std::ofstream(root_ / "sys/class/block/dm-5/dm/uuid") << "LVM-Xq3vR9\n";
  std::vector<std::string> asked;
  DeviceMapper dm;
  dm.table = [&](unsigned major, unsigned minor) -> Result<std::vector<DeviceMapperTarget>> {
    asked.push_back(std::to_string(major) + ":" + std::to_string(minor));
    if (minor == 1) {
      return std::vector<DeviceMapperTarget>{{"linear", "253:0 0"}};
    }
    return std::vector<DeviceMapperTarget>{
        {"multipath", "1 queue_if_no_path 0 1 1 service-time 0 2 2 8:0 1 1 8:16 1 1"}};
  };
  const auto lus = discover({"naa.6001405b1f0ce0000000000000000007"}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  ASSERT_EQ((*lus)[0].paths.size(), 2U);
  const auto maps = multipath_maps((*lus)[0], env_, dm);
  ASSERT_TRUE(maps.has_value()) << maps.error().message();
  ASSERT_EQ(maps->size(), 1U);
  EXPECT_EQ((*maps)[0].name, "dm-0");
  EXPECT_EQ((*maps)[0].major, 253U);
  EXPECT_EQ((*maps)[0].minor, 0U);
  EXPECT_TRUE((*maps)[0].queueing);
  EXPECT_EQ(asked, (std::vector<std::string>{"253:0", "253:1"}));

  // A map whose table cannot be read (suspended, going away) may be holding writes: listed as
  // queueing, with the reason, never left out.
  dm.table = [](unsigned, unsigned minor) -> Result<std::vector<DeviceMapperTarget>> {
    return tl::unexpected(
        Error::os(EBUSY, "device-mapper device 253:" + std::to_string(minor) + " is suspended"));
  };
  const auto unreadable = multipath_maps((*lus)[0], env_, dm);
  ASSERT_TRUE(unreadable.has_value()) << unreadable.error().message();
  ASSERT_EQ(unreadable->size(), 2U) << "dm-0, and dm-1 whose table said nothing";
  EXPECT_TRUE((*unreadable)[0].queueing);
  EXPECT_NE((*unreadable)[0].unread.find("the table of dm-0, device-mapper device 253:0 is "
                                         "suspended"),
            std::string::npos)
      << (*unreadable)[0].unread;
}

// multipath-tools names its map by the LU's WWID ("mpath-3" and the NAA's digits): a map whose
// paths are all gone (the one that queues) is found by that name, with no path left to lead to it.
TEST_F(FakeSysfs, AMultipathMapWithNoPathLeftIsFoundByItsWwid) {
  add_scsi_disk("0:0:1:0", "sda", 0, "sg0", 0, 0x07);
  stack("dm-6", {}, 6);
  std::ofstream(root_ / "sys/class/block/dm-6/dm/uuid")
      << "mpath-36001405b1f0ce0000000000000000007\n";
  stack("dm-7", {}, 7);  // another LU's
  std::ofstream(root_ / "sys/class/block/dm-7/dm/uuid")
      << "mpath-36001405b1f0ce0000000000000000008\n";
  DeviceMapper dm;
  dm.table = [](unsigned, unsigned) -> Result<std::vector<DeviceMapperTarget>> {
    return std::vector<DeviceMapperTarget>{{"multipath", "1 queue_if_no_path 0 0 0"}};
  };
  auto lus = discover({dev("sda")}, env_);
  ASSERT_TRUE(lus.has_value()) << lus.error().message();
  (*lus)[0].paths.clear();  // every path gone
  const auto maps = multipath_maps((*lus)[0], env_, dm);
  ASSERT_TRUE(maps.has_value()) << maps.error().message();
  ASSERT_EQ(maps->size(), 1U);
  EXPECT_EQ((*maps)[0].name, "dm-6");
  EXPECT_TRUE((*maps)[0].queueing);
}

TEST(MultipathTest, QueueingIsAFeatureWordOfTheTable) {
  EXPECT_TRUE(queues_if_no_path("1 queue_if_no_path 0 1 1 round-robin 0 1 1 8:16 1"));
  EXPECT_TRUE(queues_if_no_path("3 pg_init_retries 5 queue_if_no_path 1 alua 1 1"));
  EXPECT_FALSE(queues_if_no_path("0 0 1 1 round-robin 0 1 1 8:16 1"));
  EXPECT_FALSE(queues_if_no_path("2 pg_init_retries 5 1 queue_if_no_path"));  // a handler's word
  EXPECT_FALSE(queues_if_no_path(""));
}

TEST(MultipathTest, SetQueueingSendsTheMessageToTheMap) {
  std::vector<std::string> sent;
  DeviceMapper dm;
  dm.message = [&](unsigned major, unsigned minor, const std::string& message) -> Result<void> {
    sent.push_back(std::to_string(major) + ":" + std::to_string(minor) + " " + message);
    return {};
  };
  const MultipathMap map{.name = "dm-4", .major = 253, .minor = 4, .queueing = true, .unread = {}};
  ASSERT_TRUE(set_queueing(map, false, dm).has_value());
  ASSERT_TRUE(set_queueing(map, true, dm).has_value());
  EXPECT_EQ(sent, (std::vector<std::string>{"253:4 fail_if_no_path", "253:4 queue_if_no_path"}));

  dm.message = [](unsigned, unsigned, const std::string&) -> Result<void> {
    return tl::unexpected(Error::os(EINVAL, "message fail_if_no_path to device-mapper device"));
  };
  const auto refused = set_queueing(map, false, dm);
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().where().rfind("dm-4: ", 0), 0U) << refused.error().where();
}

}  // namespace
}  // namespace blkfence::pr

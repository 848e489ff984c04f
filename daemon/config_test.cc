// Proves that parse_config() accepts the documented configuration (the example file included),
// fills in the documented defaults, and refuses every malformed one with a message that names the
// file, the line and column, the resource and the key: wrong types, missing and unknown keys,
// out-of-range values, duplicate resources and devices, inconsistent durations, and the reboot
// opt-in. Also that format_config() writes what parse_config() reads back unchanged, and that
// load_config() reports unreadable and oversized files.
#include "config.h"

#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <unistd.h>

namespace blkfence::daemon {
namespace {

using std::chrono::milliseconds;

constexpr std::string_view kHead = R"(cluster = "pg-prod"
node_id = 7
)";

// A valid configuration with one resource; `extra` goes into that [[resource]] table.
std::string with_resource(std::string_view extra) {
  return std::string(kHead) + "[[resource]]\nname = \"pgdata\"\ndevices = [\"/dev/sdb\"]\n" +
         std::string(extra);
}

// The same with `devices_line` in place of the devices.
std::string with_devices(std::string_view devices_line) {
  return std::string(kHead) + "[[resource]]\nname = \"pgdata\"\n" + std::string(devices_line);
}

// The error message of a configuration that must fail, or a note that it did not.
std::string error_of(std::string_view text) {
  const auto config = parse_config(text, "blkfence.toml");
  if (config) {
    return "(accepted)";
  }
  EXPECT_EQ(config.error().code(), ErrorCode::kInvalidArgument);
  return config.error().where();
}

Config parsed(std::string_view text) {
  auto config = parse_config(text, "blkfence.toml");
  EXPECT_TRUE(config.has_value()) << (config ? "" : config.error().where());
  return config ? *config : Config{};
}

// The first resource of a configuration that must parse.
ResourceConfig first_resource(std::string_view text) {
  const Config config = parsed(text);
  if (config.resources.empty()) {
    ADD_FAILURE() << "no resource in:\n" << text;
    return ResourceConfig{};
  }
  return config.resources[0];
}

TEST(Config, ExampleFileParsesAndSaysWhatItShows) {
  const auto config = load_config(BLKFENCE_EXAMPLE_CONFIG);
  ASSERT_TRUE(config.has_value()) << config.error().message();
  EXPECT_EQ(config->cluster, "pg-prod");
  EXPECT_EQ(config->node_id, 1);
  EXPECT_EQ(config->control_group, "blkfence");
  EXPECT_EQ(config->state_dir, "/var/lib/blkfence");
  EXPECT_EQ(config->run_dir, "/run/blkfence");
  EXPECT_EQ(config->transport, "auto");
  ASSERT_EQ(config->resources.size(), 2U);

  const ResourceConfig& pgdata = config->resources[0];
  EXPECT_EQ(pgdata.name, "pgdata");
  EXPECT_EQ(pgdata.devices,
            (std::vector<std::string>{"naa.6001405c3f2a4b1e9d7c8a6b5e4f3d21",
                                      "/dev/disk/by-id/wwn-0x6001405a1b2c3d4e5f60718293a4b5c6"}));
  EXPECT_EQ(pgdata.mode, Mode::kExclusive);
  EXPECT_EQ(pgdata.type, codec::PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(pgdata.preempt_abort);
  EXPECT_EQ(pgdata.check_interval, milliseconds(1000));
  EXPECT_EQ(pgdata.lease, milliseconds(5000));
  EXPECT_EQ(pgdata.keys_every, 4);
  EXPECT_EQ(pgdata.command_timeout, milliseconds(2000));
  EXPECT_EQ(pgdata.on_fenced.action, OnFencedAction::kKillUnits);
  EXPECT_EQ(pgdata.units, std::vector<std::string>{"postgresql@15-main.service"});

  const ResourceConfig& logs = config->resources[1];
  EXPECT_EQ(logs.name, "shared-logs");
  EXPECT_EQ(logs.devices, std::vector<std::string>{"eui.0025385b71b0a1c2"});
  EXPECT_EQ(logs.mode, Mode::kShared);
  EXPECT_TRUE(logs.preempt_abort);
  EXPECT_EQ(logs.check_interval, milliseconds(500));
  EXPECT_EQ(logs.lease, milliseconds(2500));
  EXPECT_EQ(logs.on_fenced.action, OnFencedAction::kNone);
}

TEST(Config, ExampleFileSetsOnlyDefaultsInItsCommentedKeys) {
  // Uncommenting every "#key = value" line of the example must change nothing: the comments show
  // the defaults.
  std::ifstream file(BLKFENCE_EXAMPLE_CONFIG);
  std::string line, uncommented;
  while (std::getline(file, line)) {
    if (line.size() > 1 && line[0] == '#' && line[1] != ' ' &&
        line.find(" = ") != std::string::npos) {
      line.erase(0, 1);
    }
    uncommented += line + "\n";
  }
  const auto original = load_config(BLKFENCE_EXAMPLE_CONFIG);
  const auto all = parse_config(uncommented, "uncommented");
  ASSERT_TRUE(original.has_value());
  ASSERT_TRUE(all.has_value()) << all.error().where();
  EXPECT_EQ(*all, *original);
}

TEST(Config, MinimalConfigGetsTheDocumentedDefaults) {
  const Config config = parsed(with_resource(""));
  EXPECT_EQ(config.cluster, "pg-prod");
  EXPECT_EQ(config.node_id, 7);
  EXPECT_EQ(config.control_group, "");
  EXPECT_EQ(config.state_dir, "/var/lib/blkfence");
  EXPECT_EQ(config.run_dir, "/run/blkfence");
  EXPECT_EQ(config.transport, "auto");
  ASSERT_EQ(config.resources.size(), 1U);
  const ResourceConfig& r = config.resources[0];
  EXPECT_EQ(r.mode, Mode::kExclusive);
  EXPECT_EQ(r.type, codec::PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_TRUE(r.preempt_abort);  // as fence_scsi: queued writes of the victim are aborted
  EXPECT_EQ(r.check_interval, milliseconds(1000));
  EXPECT_EQ(r.lease, milliseconds(5000));
  EXPECT_EQ(r.keys_every, 4);
  EXPECT_EQ(r.command_timeout, milliseconds(2000));
  EXPECT_EQ(r.on_fenced.action, OnFencedAction::kStopUnits);
  EXPECT_TRUE(r.units.empty());
}

TEST(Config, EveryTopLevelKey) {
  const Config config = parsed(R"(cluster = "c 1"
node_id = 65535
control_group = "pg_admins"
state_dir = "/srv/blkfence/state"
run_dir = "/run/bf"
transport = "sgio"
[[resource]]
name = "a"
devices = ["naa.6001405c3f2a4b1e"]
)");
  EXPECT_EQ(config.cluster, "c 1");
  EXPECT_EQ(config.node_id, 65535);
  EXPECT_EQ(config.control_group, "pg_admins");
  EXPECT_EQ(config.state_dir, "/srv/blkfence/state");
  EXPECT_EQ(config.run_dir, "/run/bf");
  EXPECT_EQ(config.transport, "sgio");
}

TEST(Config, TomlSyntaxErrorsNameLineAndColumn) {
  const std::string error = error_of("cluster = \"x\"\nnode_id = = 3\n");
  EXPECT_TRUE(error.starts_with("blkfence.toml:2:")) << error;
  // toml++ refuses a key defined twice; that too is reported with its position.
  EXPECT_TRUE(error_of("cluster = \"a\"\ncluster = \"b\"\n").starts_with("blkfence.toml:2:"));
  EXPECT_TRUE(error_of("cluster = \"\xff\"\n").starts_with("blkfence.toml:1:"));
}

// Text toml++ cannot parse safely is refused before it sees it (toml_guard.h, whose tests cover
// the scan), with the guard's message; non-ASCII text stays welcome in comments and string values.
TEST(Config, NonAsciiOnlyInStringValuesAndComments) {
  EXPECT_EQ(first_resource("# Zürich, \xe3\x81\x82\n" +
                           with_resource("on_fenced = [\"/bin/é\", '\xe3\x81\x82', "
                                         "\"\"\"\xc2\xa7\n\xc2\xa7\"\"\"]  # ü\n"))
                .on_fenced.command,
            (std::vector<std::string>{"/bin/é", "\xe3\x81\x82", "\xc2\xa7\n\xc2\xa7"}));
  EXPECT_EQ(error_of("cluster = \"c\"\n\xc3\xa9 = 1\n"),
            "blkfence.toml:2:1: a non-ASCII character outside a string value or comment (keys and "
            "bare values are ASCII)");
  EXPECT_EQ(parsed("\xef\xbb\xbf" + with_resource("")).cluster, "pg-prod");
}

TEST(Config, WrongTypesNameKeyPositionAndValue) {
  EXPECT_EQ(error_of("cluster = \"x\"\n\nnode_id = \"abc\"\n"),
            "blkfence.toml:3:11: node_id: expected an integer 1..65535, got \"abc\"");
  EXPECT_EQ(error_of("cluster = \"x\"\nnode_id = 1.5\n"),
            "blkfence.toml:2:11: node_id: expected an integer 1..65535, got 1.5");
  EXPECT_EQ(error_of("cluster = 5\n"),
            "blkfence.toml:1:11: cluster: expected 1..64 printable ASCII characters, got 5");
  EXPECT_EQ(error_of("cluster = [\"x\"]\n"),
            "blkfence.toml:1:11: cluster: expected 1..64 printable ASCII characters, got an "
            "array");
  EXPECT_EQ(error_of(std::string(kHead) + "state_dir = true\n"),
            "blkfence.toml:3:13: state_dir: expected an absolute path, got true");
  EXPECT_EQ(error_of(std::string(kHead) + "transport = 1979-05-27\n"),
            "blkfence.toml:3:13: transport: expected \"auto\", \"uring\" or \"sgio\", got a date");
  EXPECT_EQ(error_of(with_devices("devices = \"/dev/sdc\"\n")),
            "blkfence.toml:5:11: resource \"pgdata\": devices: expected an array of a WWN "
            "(\"naa.\", \"eui.\" or \"t10.\" as the kernel's wwid shows it) or an absolute /dev/ "
            "path, got \"/dev/sdc\"");
  EXPECT_EQ(error_of(with_resource("units = [\"a.service\", 3]\n")),
            "blkfence.toml:6:23: resource \"pgdata\": units: expected a systemd unit name such as "
            "\"postgresql.service\", got 3");
  EXPECT_EQ(error_of(with_resource("keys_every = \"4\"\n")),
            "blkfence.toml:6:14: resource \"pgdata\": keys_every: expected an integer 1..1000, got "
            "\"4\"");
  EXPECT_EQ(error_of(with_resource("allow_reboot = \"yes\"\n")),
            "blkfence.toml:6:16: resource \"pgdata\": allow_reboot: expected true or false, got "
            "\"yes\"");
  EXPECT_EQ(error_of(with_resource("mode = {}\n")),
            "blkfence.toml:6:8: resource \"pgdata\": mode: expected \"exclusive\", \"shared\" or "
            "\"primary\", "
            "got a table");
}

TEST(Config, MissingKeys) {
  EXPECT_EQ(error_of("node_id = 1\n"),
            "blkfence.toml: cluster: missing (the cluster's name, the same on every node)");
  EXPECT_EQ(error_of("cluster = \"x\"\n"),
            "blkfence.toml: node_id: missing (this node's id, 1..65535, unique in the cluster)");
  EXPECT_EQ(error_of(kHead), "blkfence.toml: resource: missing (at least one [[resource]] table)");
  EXPECT_EQ(error_of(std::string(kHead) + "\n[[resource]]\ndevices = [\"/dev/sdb\"]\n"),
            "blkfence.toml:4: resource #1: name: missing (the resource's name, as blkfencectl "
            "calls it)");
  EXPECT_EQ(error_of(std::string(kHead) + "[[resource]]\nname = \"pgdata\"\n"),
            "blkfence.toml:3: resource \"pgdata\": devices: missing (the LUs of this resource, by "
            "WWN or /dev path)");
}

TEST(Config, UnknownKeysAreErrorsNamingTheKey) {
  EXPECT_EQ(error_of("cluster = \"x\"\nnode_id = 1\nclustr = \"y\"\n"),
            "blkfence.toml:3:1: unknown key \"clustr\" (expected one of: cluster, node_id, "
            "control_group, state_dir, run_dir, transport, resource)");
  // The first in document order, not in toml++'s (sorted) order; reported before missing keys.
  EXPECT_TRUE(error_of("zz = 1\naa = 2\n").starts_with("blkfence.toml:1:1: unknown key \"zz\""));
  const std::string in_resource = error_of(with_resource("leese = \"5s\"\n"));
  EXPECT_TRUE(in_resource.starts_with(
      "blkfence.toml:6:1: resource \"pgdata\": unknown key \"leese\" (expected one of: name, "))
      << in_resource;
  // A sub-table inside a resource is an unknown key too.
  EXPECT_TRUE(error_of(with_resource("[resource.extra]\nx = 1\n"))
                  .starts_with("blkfence.toml:6:11: resource \"pgdata\": unknown key \"extra\""));
  // A resource without a valid name is called by its position.
  EXPECT_TRUE(error_of(std::string(kHead) + "[[resource]]\nnam = \"x\"\n")
                  .starts_with("blkfence.toml:4:1: resource #1: unknown key \"nam\""));
}

TEST(Config, OutOfRangeValues) {
  EXPECT_EQ(error_of("cluster = \"x\"\nnode_id = 0\n"),
            "blkfence.toml:2:11: node_id: expected an integer 1..65535, got 0");
  EXPECT_EQ(error_of("cluster = \"x\"\nnode_id = 65536\n"),
            "blkfence.toml:2:11: node_id: expected an integer 1..65535, got 65536");
  EXPECT_EQ(error_of("cluster = \"x\"\nnode_id = -1\n"),
            "blkfence.toml:2:11: node_id: expected an integer 1..65535, got -1");
  EXPECT_EQ(
      error_of(with_resource("keys_every = 0\n")),
      "blkfence.toml:6:14: resource \"pgdata\": keys_every: expected an integer 1..1000, got 0");
  EXPECT_EQ(first_resource(with_resource("keys_every = 1000\n")).keys_every, 1000);
  EXPECT_NE(error_of(with_resource("keys_every = 1001\n")), "(accepted)");
}

TEST(Config, ClusterNames) {
  EXPECT_EQ(parsed("cluster = \"" + std::string(64, 'c') +
                   "\"\nnode_id = 1\n[[resource]]\n"
                   "name = \"r\"\ndevices = [\"/dev/sdb\"]\n")
                .cluster.size(),
            64U);
  EXPECT_EQ(error_of("cluster = \"" + std::string(65, 'c') + "\"\n"),
            "blkfence.toml:1:11: cluster: expected 1..64 printable ASCII characters (no space at "
            "either end), got \"" +
                std::string(48, 'c') + "\"...");
  EXPECT_NE(error_of("cluster = \"\"\n"), "(accepted)");
  EXPECT_NE(error_of("cluster = \" x\"\n"), "(accepted)");
  EXPECT_EQ(error_of("cluster = \"a\\u0000b\"\n"),
            "blkfence.toml:1:11: cluster: expected 1..64 printable ASCII characters (no space at "
            "either end), got \"a\\u0000b\"");
  EXPECT_NE(error_of("cluster = \"caf\xc3\xa9\"\n"), "(accepted)");
}

TEST(Config, ControlGroupDirectoriesTransport) {
  EXPECT_EQ(error_of(std::string(kHead) + "control_group = \"\"\n"),
            "blkfence.toml:3:17: control_group: expected a unix group name (1..32 characters A-Z "
            "a-z 0-9 _ . -, not starting with -), got \"\"; leave the key out to allow root only");
  EXPECT_NE(error_of(std::string(kHead) + "control_group = \"-x\"\n"), "(accepted)");
  EXPECT_NE(error_of(std::string(kHead) + "control_group = \"a b\"\n"), "(accepted)");
  EXPECT_EQ(error_of(std::string(kHead) + "state_dir = \"var/lib\"\n"),
            "blkfence.toml:3:13: state_dir: expected an absolute path, got \"var/lib\"");
  EXPECT_NE(error_of(std::string(kHead) + "run_dir = \"/run/\\n\"\n"), "(accepted)");
  // sockaddr_un: run_dir + "/control.sock" in 107 bytes.
  const std::string fits = "/" + std::string(93, 'r');
  EXPECT_EQ(parsed(std::string(kHead) + "run_dir = \"" + fits +
                   "\"\n[[resource]]\nname = \"r\"\ndevices = [\"/dev/sdb\"]\n")
                .run_dir,
            fits);
  EXPECT_EQ(error_of(std::string(kHead) + "run_dir = \"" + fits + "r\"\n"),
            "blkfence.toml:3:11: run_dir: too long: the control socket, run_dir + "
            "\"/control.sock\", must fit in 107 bytes (sockaddr_un)");
  EXPECT_EQ(
      error_of(std::string(kHead) + "transport = \"spdk\"\n"),
      "blkfence.toml:3:13: transport: expected \"auto\", \"uring\" or \"sgio\", got \"spdk\"");
  EXPECT_EQ(parsed(with_resource("") + "").transport, "auto");
}

TEST(Config, ResourceLayout) {
  EXPECT_EQ(error_of(std::string(kHead) + "[resource]\nname = \"x\"\n"),
            "blkfence.toml:3:1: resource: expected [[resource]] tables (an array of tables), got a "
            "table; write [[resource]], not [resource]");
  EXPECT_EQ(error_of(std::string(kHead) + "resource = []\n"),
            "blkfence.toml:3:12: resource: at least one [[resource]] table");
  EXPECT_EQ(error_of(std::string(kHead) + "resource = [1]\n"),
            "blkfence.toml:3:13: resource: expected [[resource]] tables (an array of tables), got "
            "1");
  // Inline tables are tables too.
  const Config config = parsed(std::string(kHead) +
                               "resource = [{name = \"a\", devices = [\"/dev/sdb\"]}, {name = "
                               "\"b\", devices = [\"/dev/sdc\"]}]\n");
  ASSERT_EQ(config.resources.size(), 2U);
  EXPECT_EQ(config.resources[1].name, "b");
}

TEST(Config, ResourceNames) {
  const std::string name64(64, 'n');
  EXPECT_EQ(first_resource(std::string(kHead) + "[[resource]]\nname = \"" + name64 +
                           "\"\ndevices = [\"/dev/sdb\"]\n")
                .name,
            name64);
  EXPECT_EQ(error_of(std::string(kHead) + "[[resource]]\nname = \"pg data\"\n"),
            "blkfence.toml:4:8: resource #1: name: expected a name of 1..64 characters A-Z a-z 0-9 "
            "_ . -, got \"pg data\"");
  EXPECT_NE(error_of(std::string(kHead) + "[[resource]]\nname = \"\"\n"), "(accepted)");
  EXPECT_NE(error_of(std::string(kHead) + "[[resource]]\nname = \"" + name64 + "n\"\n"),
            "(accepted)");
  EXPECT_EQ(error_of(with_resource("[[resource]]\nname = \"pgdata\"\ndevices = [\"/dev/sdc\"]\n")),
            "blkfence.toml:7:8: resource \"pgdata\": name: another [[resource]] has this name "
            "already; names are unique");
}

TEST(Config, Devices) {
  const Config config =
      parsed(std::string(kHead) +
             "[[resource]]\nname = \"r\"\ndevices = ["
             "\"NAA.6001405C3F2A4B1E9D7C8A6B5E4F3D21\", \"naa.5000c500a1b2c3d4\", "
             "\"eui.0025385b71b0a1c2d3e4f5a6\", \"t10.LIO-ORG disk0 1234\", "
             "\"/dev/mapper/pgdata\"]\n");
  ASSERT_EQ(config.resources.size(), 1U);
  EXPECT_EQ(config.resources[0].devices,
            (std::vector<std::string>{"naa.6001405c3f2a4b1e9d7c8a6b5e4f3d21",
                                      "naa.5000c500a1b2c3d4", "eui.0025385b71b0a1c2d3e4f5a6",
                                      "t10.LIO-ORG disk0 1234", "/dev/mapper/pgdata"}));
  const std::string expected =
      "expected a WWN (\"naa.\", \"eui.\" or \"t10.\" as the kernel's wwid shows it) or an "
      "absolute /dev/ path, got ";
  EXPECT_EQ(error_of(with_devices("devices = [\"sdb\"]\n")),
            "blkfence.toml:5:12: resource \"pgdata\": devices: " + expected + "\"sdb\"");
  for (const char* bad :
       {"naa.6001405c3f2a4b1", "naa.6001405c3f2a4b1g", "eui.12", "t10.", "/dev/", "/dev/sdb/",
        "/dev/../etc/passwd", "/etc/passwd", "wwn-0x6001405c3f2a4b1e", ""}) {
    EXPECT_NE(error_of(with_devices("devices = [\"" + std::string(bad) + "\"]\n")), "(accepted)")
        << bad;
  }
  EXPECT_EQ(error_of(with_devices("devices = []\n")),
            "blkfence.toml:5:11: resource \"pgdata\": devices: at least one device");
  // Duplicates are found after normalising the WWN's case.
  EXPECT_EQ(
      error_of(with_devices("devices = [\"naa.6001405c3f2a4b1e\", \"NAA.6001405C3F2A4B1E\"]\n")),
      "blkfence.toml:5:36: resource \"pgdata\": devices: \"naa.6001405c3f2a4b1e\" is listed "
      "twice");
  EXPECT_EQ(error_of(with_resource("[[resource]]\nname = \"other\"\ndevices = [\"/dev/sdc\", "
                                   "\"/dev/sdb\"]\n")),
            "blkfence.toml:8:11: resource \"other\": devices: \"/dev/sdb\" is already a device of "
            "resource \"pgdata\": a LU belongs to one resource");
}

TEST(Config, ModeTypePreempt) {
  const ResourceConfig shared = first_resource(
      with_resource("mode = \"shared\"\ntype = \"exclusive-access-all-registrants\"\n"
                    "preempt = \"preempt-and-abort\"\n"));
  EXPECT_EQ(shared.mode, Mode::kShared);
  EXPECT_EQ(shared.type, codec::PrType::kExclusiveAccessAllRegistrants);
  EXPECT_TRUE(shared.preempt_abort);
  // Plain PREEMPT is an explicit choice (for targets that mishandle PREEMPT AND ABORT).
  EXPECT_FALSE(first_resource(with_resource("preempt = \"preempt\"\n")).preempt_abort);
  const std::pair<const char*, codec::PrType> types[] = {
      {"write-exclusive", codec::PrType::kWriteExclusive},
      {"exclusive-access", codec::PrType::kExclusiveAccess},
      {"write-exclusive-registrants-only", codec::PrType::kWriteExclusiveRegistrantsOnly},
      {"exclusive-access-registrants-only", codec::PrType::kExclusiveAccessRegistrantsOnly},
      {"write-exclusive-all-registrants", codec::PrType::kWriteExclusiveAllRegistrants},
      {"exclusive-access-all-registrants", codec::PrType::kExclusiveAccessAllRegistrants},
  };
  for (const auto& [name, type] : types) {
    const std::string mode = codec::is_all_registrants(type) ? "shared" : "primary";
    EXPECT_EQ(first_resource(
                  with_resource("mode = \"" + mode + "\"\ntype = \"" + std::string(name) + "\"\n"))
                  .type,
              type);
    EXPECT_EQ(pr_type_name(type), name);
  }
  // Shared mode defaults to an all-registrants type and refuses the others: their reservation
  // leaves with the member that holds it (docs/protocol.md, "Shared mode").
  EXPECT_EQ(first_resource(with_resource("mode = \"shared\"\n")).type,
            codec::PrType::kWriteExclusiveAllRegistrants);
  EXPECT_EQ(first_resource(with_resource("mode = \"primary\"\n")).type,
            codec::PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_EQ(
      error_of(with_resource("mode = \"shared\"\ntype = \"write-exclusive-registrants-only\"\n")),
      "blkfence.toml:7:8: resource \"pgdata\": type: mode = \"shared\" needs an all-registrants "
      "type: under \"write-exclusive-registrants-only\" the reservation leaves with the member "
      "that holds it, and the LUs are open to every nexus, a fenced member's included, until "
      "another member reserves them; use \"write-exclusive-all-registrants\" (the default)");
  EXPECT_EQ(error_of(with_resource("mode = \"single\"\n")),
            "blkfence.toml:6:8: resource \"pgdata\": mode: expected \"exclusive\", \"shared\" or "
            "\"primary\", "
            "got \"single\"");
  EXPECT_TRUE(error_of(with_resource("type = 5\n"))
                  .starts_with("blkfence.toml:6:8: resource \"pgdata\": type: expected "
                               "\"write-exclusive\", "));
  EXPECT_EQ(error_of(with_resource("type = \"write-exclusive-all-registrants\"\n")),
            "blkfence.toml:6:8: resource \"pgdata\": type: an all-registrants type cannot be used "
            "with mode = \"exclusive\": every registrant holds it, so no single holder can be "
            "verified; use \"write-exclusive-registrants-only\"");
  EXPECT_EQ(error_of(with_resource("preempt = \"abort\"\n")),
            "blkfence.toml:6:11: resource \"pgdata\": preempt: expected \"preempt\" or "
            "\"preempt-and-abort\", got \"abort\"");
}

TEST(Config, DurationForms) {
  const auto interval = [](std::string_view line) {
    return first_resource(with_resource(std::string(line) + "\nlease = \"120s\"\n")).check_interval;
  };
  EXPECT_EQ(interval("check_interval = \"250ms\""), milliseconds(250));
  EXPECT_EQ(interval("check_interval = \"1s\""), milliseconds(1000));
  EXPECT_EQ(interval("check_interval = \"2.5s\""), milliseconds(2500));
  EXPECT_EQ(interval("check_interval = \"0.01s\""), milliseconds(10));
  EXPECT_EQ(interval("check_interval = \"1.250s\""), milliseconds(1250));
  EXPECT_EQ(interval("check_interval = \"60s\"\ncommand_timeout = \"1s\""), milliseconds(60000));
  EXPECT_EQ(interval("check_interval_ms = 750"), milliseconds(750));
  // The same syntax as blkfencectl's --timeout (blkfence/control/duration.h): minutes too.
  EXPECT_EQ(interval("check_interval = \"0.5m\""), milliseconds(30'000));
  EXPECT_EQ(first_resource(with_resource("lease = \"2m\"\n")).lease, milliseconds(120'000));
  const ResourceConfig r =
      first_resource(with_resource("lease_ms = 3000\ncommand_timeout_ms = 2999\n"));
  EXPECT_EQ(r.lease, milliseconds(3000));
  EXPECT_EQ(r.command_timeout, milliseconds(2999));
}

TEST(Config, BadDurations) {
  const std::string expected =
      "blkfence.toml:6:18: resource \"pgdata\": check_interval: expected a number and a unit (ms, "
      "s, m or h): \"250ms\", \"1s\", \"2.5s\", \"2m\", in 10ms..60s, got ";
  // The syntax itself is tested in control/src/duration_test.cc; these prove the config uses it.
  for (const char* bad : {"1 s", "1.5ms", "1.0005s", "-1s", "1", "s", ".5s", "1.s", "1min", "1e3ms",
                          "+1s", "9999999999s", ""}) {
    EXPECT_EQ(error_of(with_resource("check_interval = \"" + std::string(bad) + "\"\n")),
              expected + "\"" + bad + "\"")
        << bad;
  }
  EXPECT_EQ(error_of(with_resource("check_interval = 250\n")),
            expected + "250 (without a unit; or write check_interval_ms = 250)");
  EXPECT_EQ(error_of(with_resource("check_interval = 2.5\n")), expected + "2.5");
  EXPECT_EQ(error_of(with_resource("check_interval = \"5ms\"\n")),
            "blkfence.toml:6:18: resource \"pgdata\": check_interval: 5ms is out of range "
            "(10ms..60s)");
  EXPECT_EQ(error_of(with_resource("check_interval = \"61s\"\n")),
            "blkfence.toml:6:18: resource \"pgdata\": check_interval: 61s is out of range "
            "(10ms..60s)");
  EXPECT_EQ(error_of(with_resource("check_interval_ms = \"250\"\n")),
            "blkfence.toml:6:21: resource \"pgdata\": check_interval_ms: expected an integer "
            "number of milliseconds 10..60000, got \"250\"");
  EXPECT_EQ(error_of(with_resource("check_interval_ms = 9\n")),
            "blkfence.toml:6:21: resource \"pgdata\": check_interval_ms: expected an integer "
            "number of milliseconds 10..60000, got 9");
  EXPECT_EQ(error_of(with_resource("check_interval = \"1s\"\ncheck_interval_ms = 1000\n")),
            "blkfence.toml:7:21: resource \"pgdata\": check_interval_ms: set either check_interval "
            "or check_interval_ms, not both");
  EXPECT_EQ(error_of(with_resource("command_timeout = \"50ms\"\n")),
            "blkfence.toml:6:19: resource \"pgdata\": command_timeout: 50ms is out of range "
            "(100ms..600s)");
  EXPECT_EQ(error_of(with_resource("lease = \"601s\"\n")),
            "blkfence.toml:6:9: resource \"pgdata\": lease: 601s is out of range (11ms..600s)");
}

TEST(Config, DurationRelations) {
  // The brief's example, word for word.
  EXPECT_EQ(error_of(std::string(kHead) + "[[resource]]\nname = \"pgdata\"\ndevices = "
                                          "[\"/dev/sdb\"]\ncheck_interval = \"5s\"\n\n\n\n\n\n"
                                          "lease = \"2s\"\n"),
            "blkfence.toml:12:9: resource \"pgdata\": lease (2s) must be longer than "
            "check_interval (5s)");
  EXPECT_EQ(error_of(with_resource("check_interval = \"5s\"\nlease = \"5s\"\n")),
            "blkfence.toml:7:9: resource \"pgdata\": lease (5s) must be longer than "
            "check_interval (5s)");
  // A default is called one, and the message points at the key that was set.
  EXPECT_EQ(error_of(with_resource("check_interval = \"10s\"\n")),
            "blkfence.toml:6:18: resource \"pgdata\": lease (5s, the default) must be longer than "
            "check_interval (10s)");
  EXPECT_EQ(error_of(with_resource("lease = \"1s\"\ncheck_interval = \"500ms\"\n")),
            "blkfence.toml:6:9: resource \"pgdata\": command_timeout (2s, the default) must be "
            "shorter than lease (1s)");
  EXPECT_EQ(error_of(with_resource("command_timeout = \"5s\"\n")),
            "blkfence.toml:6:19: resource \"pgdata\": command_timeout (5s) must be shorter than "
            "lease (5s, the default)");
  const ResourceConfig r = first_resource(
      with_resource("check_interval = \"250ms\"\nlease = \"251ms\"\ncommand_timeout = "
                    "\"250ms\"\n"));
  EXPECT_EQ(r.lease, milliseconds(251));
}

TEST(Config, OnFenced) {
  const auto action = [](std::string_view lines) {
    return first_resource(with_resource(lines)).on_fenced;
  };
  EXPECT_EQ(action("on_fenced = \"none\"").action, OnFencedAction::kNone);
  EXPECT_EQ(action("on_fenced = \"stop-units\"\nunits = [\"a.service\"]").action,
            OnFencedAction::kStopUnits);
  EXPECT_EQ(action("on_fenced = \"kill-units\"\nunits = [\"a.scope\"]").action,
            OnFencedAction::kKillUnits);
  EXPECT_EQ(action("on_fenced = \"reboot\"\nallow_reboot = true").action, OnFencedAction::kReboot);
  const OnFenced command = action("on_fenced = [\"/usr/local/sbin/hook\", \"pgdata\", \"\"]");
  EXPECT_EQ(command.action, OnFencedAction::kCommand);
  EXPECT_EQ(command.command, (std::vector<std::string>{"/usr/local/sbin/hook", "pgdata", ""}));

  EXPECT_EQ(error_of(with_resource("on_fenced = \"reboot\"\n")),
            "blkfence.toml:6:13: resource \"pgdata\": on_fenced: \"reboot\" reboots this node when "
            "the resource is fenced; it needs allow_reboot = true in the same [[resource]] as an "
            "explicit opt-in");
  EXPECT_NE(error_of(with_resource("on_fenced = \"reboot\"\nallow_reboot = false\n")),
            "(accepted)");
  EXPECT_EQ(error_of(with_resource("on_fenced = \"kill-units\"\n")),
            "blkfence.toml:6:13: resource \"pgdata\": on_fenced: \"kill-units\" needs the units to "
            "act on: set units = [\"name.service\", ...] in this [[resource]]");
  EXPECT_EQ(error_of(with_resource("on_fenced = \"command\"\n")),
            "blkfence.toml:6:13: resource \"pgdata\": on_fenced: give the command itself as an "
            "array: on_fenced = [\"/path/to/program\", \"arg\", ...]");
  EXPECT_EQ(
      error_of(with_resource("on_fenced = \"halt\"\n")),
      "blkfence.toml:6:13: resource \"pgdata\": on_fenced: expected \"none\", \"stop-units\", "
      "\"kill-units\", \"reboot\" or a command as an array [\"/path/to/program\", \"arg\", "
      "...], got \"halt\"");
  EXPECT_EQ(error_of(with_resource("on_fenced = [\"hook\"]\n")),
            "blkfence.toml:6:14: resource \"pgdata\": on_fenced: the program: expected an absolute "
            "path without NUL characters, got \"hook\"");
  EXPECT_EQ(error_of(with_resource("on_fenced = [\"/bin/hook\", 1]\n")),
            "blkfence.toml:6:27: resource \"pgdata\": on_fenced: an argument: expected a string "
            "without NUL characters, got 1");
  EXPECT_NE(error_of(with_resource("on_fenced = [\"/bin/hook\", \"a\\u0000b\"]\n")), "(accepted)");
  EXPECT_EQ(error_of(with_resource("on_fenced = []\n")),
            "blkfence.toml:6:13: resource \"pgdata\": on_fenced: a command needs its program and "
            "at most 63 arguments, got 0 entries");
  EXPECT_TRUE(error_of(with_resource("on_fenced = 1\n"))
                  .starts_with("blkfence.toml:6:13: resource \"pgdata\": on_fenced: expected "
                               "\"none\", "));
}

TEST(Config, Units) {
  EXPECT_EQ(first_resource(with_resource("units = [\"postgresql@15-main.service\", \"app.scope\", "
                                         "\"x\\\\x2d.slice\"]\n"))
                .units.size(),
            3U);
  for (const char* bad :
       {"postgresql", "postgresql.", ".service", "pg.servic", "a b.service", "a/b.service", ""}) {
    EXPECT_NE(error_of(with_resource("units = [\"" + std::string(bad) + "\"]\n")), "(accepted)")
        << bad;
  }
  EXPECT_EQ(error_of(with_resource("units = [\"a.service\", \"a.service\"]\n")),
            "blkfence.toml:6:23: resource \"pgdata\": units: \"a.service\" is listed twice");
}

TEST(Config, Limits) {
  std::string devices = "devices = [";
  for (int i = 0; i < 257; ++i) {
    devices += "\"/dev/d" + std::to_string(i) + "\",";
  }
  devices += "]\n";
  EXPECT_EQ(error_of(std::string(kHead) + "[[resource]]\nname = \"r\"\n" + devices),
            "blkfence.toml:5:11: resource \"r\": devices: at most 256 entries, got 257");
}

TEST(Config, FormatConfigRoundTrips) {
  const auto example = load_config(BLKFENCE_EXAMPLE_CONFIG);
  ASSERT_TRUE(example.has_value());
  for (const Config& config :
       {*example, parsed(with_resource("")),
        parsed(with_resource("on_fenced = [\"/bin/x\", \"a \\\"b\\\"\\t\\\\\"]\nlease = "
                             "\"1.001s\"\ncheck_interval = \"999ms\"\ncommand_timeout_ms = 100\n")),
        parsed(with_resource("on_fenced = \"reboot\"\nallow_reboot = true\nmode = \"shared\"\n"
                             "type = \"write-exclusive-all-registrants\"\n"))}) {
    const std::string text = format_config(config);
    const auto again = parse_config(text, "formatted");
    ASSERT_TRUE(again.has_value()) << again.error().where() << "\n" << text;
    EXPECT_EQ(*again, config) << text;
  }
}

TEST(Config, FormatDuration) {
  EXPECT_EQ(format_duration(milliseconds(0)), "0ms");
  EXPECT_EQ(format_duration(milliseconds(250)), "250ms");
  EXPECT_EQ(format_duration(milliseconds(999)), "999ms");
  EXPECT_EQ(format_duration(milliseconds(1000)), "1s");
  EXPECT_EQ(format_duration(milliseconds(2500)), "2.5s");
  EXPECT_EQ(format_duration(milliseconds(1001)), "1.001s");
  EXPECT_EQ(format_duration(milliseconds(1250)), "1.25s");
  EXPECT_EQ(format_duration(milliseconds(600000)), "600s");
}

TEST(Config, LoadConfigReportsUnreadableAndOversizedFiles) {
  const auto missing = load_config("/nonexistent/blkfence.toml");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), ErrorCode::kOs);
  EXPECT_EQ(missing.error().errno_value(), ENOENT);
  EXPECT_EQ(missing.error().where(), "cannot open /nonexistent/blkfence.toml");

  const auto directory = load_config("/");
  ASSERT_FALSE(directory.has_value());
  EXPECT_EQ(directory.error().errno_value(), EISDIR);

  char path[] = "/tmp/blkfence_config_test_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  {
    std::ofstream big(path);
    big << "# " << std::string(kMaxConfigSize, 'x') << "\n";
  }
  const auto oversized = load_config(path);
  ASSERT_FALSE(oversized.has_value());
  EXPECT_EQ(oversized.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(oversized.error().where(),
            std::string(path) + ": larger than 1024 KiB; not a blkfence configuration");
  {
    std::ofstream bad(path);
    bad << "cluster = \"x\"\nnode_id = 0\n";
  }
  const auto named = load_config(path);
  ASSERT_FALSE(named.has_value());
  EXPECT_EQ(named.error().where(),
            std::string(path) + ":2:11: node_id: expected an integer 1..65535, got 0");
  ::unlink(path);
}

}  // namespace
}  // namespace blkfence::daemon

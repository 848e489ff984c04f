// libFuzzer harness for the configuration parser (daemon layer, docs/operations.md): proves that
// parse_config() takes any text, including what toml++ itself refuses, without crashing or
// throwing; that a refusal is one kInvalidArgument message naming the source; that an accepted
// configuration keeps every documented limit (names, node id, devices, duration ranges and their
// order, keys_every, the on_fenced rules, no LU in two resources); and that format_config() writes
// it as TOML that parses back to an equal configuration and formats to the same text. toml++ is
// compiled into the harness with config.cc, so its parser is instrumented too. Single-threaded, as
// libFuzzer calls it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "blkfence/assert.h"
#include "blkfence/control/text.h"

#include "config.h"

namespace blkfence::daemon {
namespace {

using control::is_valid_resource_name;
using control::kMaxNameSize;
using std::chrono::milliseconds;

constexpr std::string_view kSource = "fuzz.toml";

bool unique(const std::vector<std::string>& values) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::find(values.begin() + static_cast<std::ptrdiff_t>(i) + 1, values.end(), values[i]) !=
        values.end()) {
      return false;
    }
  }
  return true;
}

void check_resource(const ResourceConfig& r) {
  BLKFENCE_ASSERT(is_valid_resource_name(r.name));
  BLKFENCE_ASSERT(!r.devices.empty() && r.devices.size() <= 256 && unique(r.devices));
  for (const std::string& device : r.devices) {
    BLKFENCE_ASSERT(device.starts_with("/dev/") || device.starts_with("naa.") ||
                    device.starts_with("eui.") || device.starts_with("t10."));
    BLKFENCE_ASSERT(device.find('\0') == std::string::npos);
  }
  BLKFENCE_ASSERT((r.mode == Mode::kShared) == codec::is_all_registrants(r.type));
  BLKFENCE_ASSERT(r.check_interval >= milliseconds(10) && r.check_interval <= milliseconds(60000));
  BLKFENCE_ASSERT(r.lease > r.check_interval && r.lease <= milliseconds(600000));
  BLKFENCE_ASSERT(r.command_timeout >= milliseconds(100) && r.command_timeout < r.lease);
  BLKFENCE_ASSERT(r.keys_every >= 1 && r.keys_every <= 1000);
  BLKFENCE_ASSERT(unique(r.units));
  for (const std::string& unit : r.units) {
    BLKFENCE_ASSERT(unit.find('.') != std::string::npos);
  }
  const OnFenced& on_fenced = r.on_fenced;
  BLKFENCE_ASSERT(on_fenced.command.empty() == (on_fenced.action != OnFencedAction::kCommand));
  if (on_fenced.action == OnFencedAction::kCommand) {
    BLKFENCE_ASSERT(on_fenced.command.front().starts_with('/'));
    for (const std::string& arg : on_fenced.command) {
      BLKFENCE_ASSERT(arg.find('\0') == std::string::npos);
    }
  }
  BLKFENCE_ASSERT(on_fenced.action != OnFencedAction::kKillUnits || !r.units.empty());
}

void check(std::string_view text) {
  const auto config = parse_config(text, kSource);
  if (!config) {
    BLKFENCE_ASSERT(config.error().code() == ErrorCode::kInvalidArgument);
    BLKFENCE_ASSERT(config.error().where().starts_with(kSource));
    return;
  }
  BLKFENCE_ASSERT(!config->cluster.empty() && config->cluster.size() <= kMaxNameSize);
  BLKFENCE_ASSERT(config->node_id >= 1);
  BLKFENCE_ASSERT(config->state_dir.starts_with('/') && config->run_dir.starts_with('/'));
  BLKFENCE_ASSERT(config->transport == "auto" || config->transport == "uring" ||
                  config->transport == "sgio");
  BLKFENCE_ASSERT(!config->resources.empty() && config->resources.size() <= 256);
  std::vector<std::string> names;
  std::vector<std::string> devices;
  for (const ResourceConfig& resource : config->resources) {
    check_resource(resource);
    names.push_back(resource.name);
    devices.insert(devices.end(), resource.devices.begin(), resource.devices.end());
  }
  BLKFENCE_ASSERT(unique(names) && unique(devices));

  const std::string formatted = format_config(*config);
  const auto again = parse_config(formatted, kSource);
  BLKFENCE_ASSERT(again.has_value());
  BLKFENCE_ASSERT(*again == *config);
  BLKFENCE_ASSERT(format_config(*again) == formatted);
}

}  // namespace
}  // namespace blkfence::daemon

// NOLINTNEXTLINE(readability-identifier-naming): the name libFuzzer calls.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  blkfence::daemon::check(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

// The daemon's configuration, /etc/blkfence/blkfence.toml (daemon layer; docs/protocol.md,
// "Resources and modes"; docs/design.md §6).
//
// parse_config() turns TOML text into a validated Config or into one precise error that names the
// file, the line and column, the resource and the key, so that blkfenced can refuse to start with a
// message an operator can act on. Unknown keys are errors: a typo must never fall back to a
// default silently. Nothing here does I/O but load_config() reading the file, nothing throws, and
// every function is pure and thread-safe. docs/operations.md ("Configuration") documents the keys.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/control/duration.h"
#include "blkfence/error.h"

namespace blkfence::daemon {

inline constexpr std::string_view kDefaultConfigPath = "/etc/blkfence/blkfence.toml";
// load_config() refuses larger files: a configuration is a few KiB, anything bigger is a mistake.
inline constexpr std::size_t kMaxConfigSize = 1024 * 1024;

// primary: shared, where the members never reserve and the primary holds (docs/protocol.md).
enum class Mode : std::uint8_t { kExclusive, kShared, kPrimary };
enum class OnFencedAction : std::uint8_t { kNone, kStopUnits, kKillUnits, kCommand, kReboot };

struct OnFenced {
  OnFencedAction action = OnFencedAction::kStopUnits;
  std::vector<std::string> command;  // argv, for kCommand; argv[0] is an absolute path

  friend bool operator==(const OnFenced&, const OnFenced&) = default;
};

struct ResourceConfig {
  std::string name;  // [A-Za-z0-9_.-]{1,64}, unique
  std::vector<std::string>
      devices;  // WWNs ("naa." and lower-case hex, "eui.", "t10.") or /dev paths
  Mode mode = Mode::kExclusive;
  codec::PrType type = codec::PrType::kWriteExclusiveRegistrantsOnly;
  // PREEMPT AND ABORT (the default, as fence_scsi) or plain PREEMPT, whose victim's queued writes
  // may still execute after the preempt (docs/protocol.md, S1).
  bool preempt_abort = true;
  std::chrono::milliseconds check_interval{1000};
  std::chrono::milliseconds lease{5000};  // > check_interval
  int keys_every = 4;                     // READ KEYS every N monitor rounds, 1..1000
  // Per SCSI command; < lease. (Not 5 s, the default lease: it must be shorter than the lease.)
  std::chrono::milliseconds command_timeout{2000};
  OnFenced on_fenced;
  std::vector<std::string> units;  // systemd units stopped or killed on fence

  friend bool operator==(const ResourceConfig&, const ResourceConfig&) = default;
};

struct Config {
  std::string cluster;                          // 1..64 printable ASCII characters
  std::uint16_t node_id = 0;                    // 1..65535
  std::string control_group;                    // empty: only root may change state
  std::string state_dir = "/var/lib/blkfence";  // persisted epochs
  std::string run_dir = "/run/blkfence";        // control.sock, RESOURCE.token
  std::string transport = "auto";               // auto | uring | sgio
  std::vector<ResourceConfig> resources;        // at least one

  friend bool operator==(const Config&, const Config&) = default;
};

// kInvalidArgument whose where() is the whole message, e.g.
// `blkfence.toml:3:9: node_id: expected an integer 1..65535, got "abc"`. source_name is what the
// messages call the text (usually the path). Reports the first problem found.
[[nodiscard]] Result<Config> parse_config(std::string_view text, std::string_view source_name);
// Reads the file (kOs when it cannot, kInvalidArgument when above kMaxConfigSize), then
// parse_config() with the path as the source name.
[[nodiscard]] Result<Config> load_config(const std::string& path);

// The configuration as canonical TOML (durations as "250ms" or "2s", every key of every resource
// spelled out): parse_config() of it gives back an equal Config. For `blkfenced --print-config`.
std::string format_config(const Config& config);

// The TOML spellings: "exclusive", "write-exclusive-registrants-only", "stop-units", ...
std::string_view to_string(Mode mode);
std::string_view to_string(OnFencedAction action);
std::string_view pr_type_name(codec::PrType type);
// Durations are read and printed as blkfence/control/duration.h says (also blkfencectl's).
using control::format_duration;

}  // namespace blkfence::daemon

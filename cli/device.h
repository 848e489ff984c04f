// blkfencectl's direct device mode: persistent reservation commands on many devices at once, a
// better sg_persist (cli). Runs one batch through libblkfence's pr::Client and reports each LU in a
// table or as JSON. Single-threaded.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/transport/transport.h"

namespace blkfence::cli {

// Exit statuses of blkfencectl (documented in --help and docs/blkfencectl.md). When LUs end
// differently, the most urgent status wins: indeterminate, then conflict, then device, then SCSI.
enum class Exit : int {
  kOk = 0,
  kScsiError = 1,      // a LU answered with an error other than a conflict
  kUsage = 2,          // bad arguments
  kDevice = 3,         // a device is missing, not SCSI, or not accessible
  kConflict = 4,       // RESERVATION CONFLICT on a LU
  kIndeterminate = 5,  // no answer in time: the command may still execute; re-read the state
  // A PR OUT refused before anything was sent: a local blkfenced manages a LU, or its socket did
  // not say whether it does (device_guard.h). Not 6: the daemon commands' 6 means no daemon runs.
  kRefused = 10,
};

enum class DeviceAction : std::uint8_t {
  kKeys,
  kReservation,
  kStatus,
  kCapabilities,
  kRegister,
  kUnregister,
  kReserve,
  kRelease,
  kPreempt,
  kPreemptAbort,
  kClear,
};

struct DeviceOptions {
  DeviceAction action = DeviceAction::kKeys;
  std::vector<std::string> devices;
  std::uint64_t key = 0;
  std::optional<std::uint64_t> old_key;  // register: REGISTER instead of REGISTER AND IGNORE
  std::uint64_t victim = 0;
  codec::PrType type = codec::PrType::kWriteExclusiveRegistrantsOnly;
  bool aptpl = false;
  bool json = false;
  bool verbose = false;
  transport::TransportKind transport = transport::TransportKind::kAuto;
  std::chrono::milliseconds timeout{10'000};
  // PR OUT actions: the control socket of the blkfenced to ask whether it manages the LUs (empty:
  // $BLKFENCE_SOCKET or the default), and whether to send without asking.
  std::string socket;
  bool force = false;
};

// Runs the action, prints the report on stdout (errors on stderr), returns the exit status.
Exit run_device(const DeviceOptions& options);

// "we-ro", "5", "write-exclusive-registrants-only" -> kWriteExclusiveRegistrantsOnly.
std::optional<codec::PrType> parse_pr_type(const std::string& text);

}  // namespace blkfence::cli

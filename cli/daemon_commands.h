// blkfencectl's commands that talk to blkfenced: status, acquire, release, fence, unfence, keys,
// watch, gate check|wait, run, metrics (cli layer). Each returns the process exit status
// (DaemonExit, documented in --help and docs/blkfencectl.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace blkfence::cli {

enum class DaemonExit : int {
  kOk = 0,
  kClosed = 1,         // gate check: the gate is closed; run: -
  kUsage = 2,          // bad arguments
  kDevice = 3,         // blkfenced could not reach or use a device
  kConflict = 4,       // another node holds the resource or this node's key, or we were fenced
  kIndeterminate = 5,  // the outcome is unknown: read the status again
  kNoDaemon = 6,       // blkfenced is not running or its socket is not reachable
  kDenied = 7,         // the daemon refused: root or control_group needed
  kTimeout = 8,        // --timeout passed first (an operation goes on in the daemon)
  kFailed = 9,         // anything else the daemon reported (bad request, busy, internal)
};

struct DaemonOptions {
  std::string socket;
  std::string resource;
  std::optional<std::uint16_t> node;  // fence
  bool json = false;
  std::optional<std::chrono::milliseconds> timeout;
};

int status_command(const DaemonOptions& options);
// acquire, release, unfence, fence
int operation_command(const std::string& op, const DaemonOptions& options);
int keys_command(const DaemonOptions& options);
int watch_command(const DaemonOptions& options);
int gate_check_command(const DaemonOptions& options);
int gate_wait_command(const DaemonOptions& options);
int metrics_command(const DaemonOptions& options);
// Starts argv once the gate is open, with BLKFENCE_TOKEN, BLKFENCE_EPOCH and BLKFENCE_RESOURCE;
// kills its process group the moment the gate closes or blkfenced goes away.
int run_command(const DaemonOptions& options, const std::vector<std::string>& argv);

}  // namespace blkfence::cli

// The transport seam: submit one SCSI command to one path and get back what happened (transport
// layer).
//
// A Transport owns every buffer of a command from submit() until the kernel has returned it: the
// caller hands over the data to send and says how many bytes it expects back, and gets the bytes in
// the Completion. That is what makes a command that missed its deadline safe: it is reported
// kIndeterminate (it may still execute on the target later, docs/protocol.md, S4), while the
// transport keeps its buffers alive until the kernel really gives them back.
//
// Implementations: io_uring over the sg v3 asynchronous interface (make_uring_transport), blocking
// SG_IO on a small thread pool (make_sgio_transport), and the simulated SPC-4 target in tests.
// A Transport is used from one thread (the daemon's event loop or the CLI); implementations may
// use threads inside.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blkfence/error.h"

namespace blkfence::transport {

enum class DataDirection : std::uint8_t { kNone, kToDevice, kFromDevice };

struct Command {
  static constexpr std::size_t kCdbSizeMax = 16;
  std::array<std::uint8_t, kCdbSizeMax> cdb{};
  std::uint8_t cdb_size = 0;
  DataDirection direction = DataDirection::kNone;
  std::vector<std::uint8_t> data_out;  // sent when direction is kToDevice
  std::uint32_t data_in_size = 0;      // bytes to receive when direction is kFromDevice
  std::chrono::milliseconds timeout{10'000};
  std::uint64_t tag = 0;  // the caller's, returned in the Completion

  // A command from a CDB of any size up to kCdbSizeMax.
  static Command from_cdb(std::span<const std::uint8_t> cdb_bytes);
};

// What happened to a command, before any look at its sense data (docs/design.md §1, transport).
enum class Outcome : std::uint8_t {
  kGood,                 // status GOOD (or CONDITION MET)
  kCheckCondition,       // status CHECK CONDITION; the sense data says why
  kReservationConflict,  // status RESERVATION CONFLICT
  kBusy,                 // BUSY, TASK SET FULL or ACA ACTIVE: try again later
  kTaskAborted,          // TASK ABORTED (e.g. by another nexus's PREEMPT AND ABORT)
  kTransportError,       // the host says the command never reached the LU (path down or busy)
  kOsError,              // the kernel refused or never sent the command; os_errno says why
  // No usable answer: the deadline passed, the midlayer timed it out or aborted it, or the path
  // broke with the command in flight. It may have executed, or may still execute, on the target.
  kIndeterminate,
};

std::string_view to_string(Outcome outcome);

struct Completion {
  std::uint64_t tag = 0;
  Outcome outcome = Outcome::kOsError;
  std::uint8_t status = 0;        // SAM status byte as the device sent it
  std::uint16_t host_status = 0;  // Linux DID_* code, 0 when the command reached the LU
  std::uint16_t driver_status = 0;
  int os_errno = 0;                   // with kOsError
  std::vector<std::uint8_t> sense;    // as the device sent it (up to 252 bytes)
  std::vector<std::uint8_t> data_in;  // the bytes actually received (data_in_size - residual)
  std::chrono::nanoseconds latency{0};
};

// Per-path handle, valid until close_path().
using PathId = std::uint32_t;

// The device node a path's fd is open on: /sys/dev/char/MAJOR:MINOR (or block) names its device.
// While the fd is open the node cannot name another device (sg frees a minor at the last close).
struct DeviceNumber {
  bool is_char = false;
  unsigned major = 0;
  unsigned minor = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Opens a path for PR commands: /dev/sgN, opened O_RDWR (root:disk 0660 by default); SG_IO also
  // takes a block device such as /dev/sdX, where the kernel lets PR commands through only with
  // CAP_SYS_RAWIO (scsi_ioctl.c: scsi_cmd_allowed()), else they complete as kOsError with EPERM.
  [[nodiscard]] virtual Result<PathId> open_path(const std::string& device) = 0;
  // Closes a path. Commands the kernel holds complete as kIndeterminate (the transport keeps their
  // buffers, and the fd, until the kernel returns them); commands still waiting in the transport's
  // queue were never sent and complete as kOsError with ECANCELED.
  virtual void close_path(PathId path) = 0;
  // The device node an open path's fd is on; nullopt for a closed path, or where the transport
  // has no device node (a simulated target).
  virtual std::optional<DeviceNumber> device_of(PathId /*path*/) const { return std::nullopt; }

  // Queues a command on a path. Never blocks: beyond what the path accepts at once (sg.c: 16
  // outstanding per fd) commands wait in the transport's own queue.
  [[nodiscard]] virtual Result<void> submit(PathId path, Command command) = 0;

  // Appends finished commands to out, waiting up to wait for the first one. Every submitted command
  // completes exactly once: with its answer, or kIndeterminate once its timeout (plus a grace for
  // the kernel's own timeout handling) has passed. A command that waited in the transport's queue
  // for that long was never sent and completes as kOsError with ETIMEDOUT.
  [[nodiscard]] virtual Result<std::size_t> reap(std::chrono::milliseconds wait,
                                                 std::vector<Completion>& out) = 0;

  // Between cork() and the matching uncork(), submit() may keep what it prepared from the kernel,
  // so that a batch of commands costs one system call instead of one each; uncork() hands it over.
  // Nests. A transport that has nothing to gain ignores both.
  virtual void cork() {}
  virtual void uncork() {}

  // Commands submitted and not yet reaped.
  virtual std::size_t in_flight() const = 0;
  // Commands already completed as kIndeterminate that the kernel has not given back yet: sg still
  // holds them, so they may still reach or run on the target. Once it is 0, every command this
  // transport reported indeterminate has come back (answered, or aborted by the midlayer's error
  // handling) and none can execute any more. nullopt: the transport cannot tell.
  virtual std::optional<std::size_t> unreturned() const { return std::nullopt; }
  // A file descriptor that polls readable when reap() has something to return (for sd-event).
  virtual int poll_fd() const = 0;
  virtual std::string_view name() const = 0;
};

// cork() for the lifetime of a scope.
class Corked {
 public:
  explicit Corked(Transport& transport) : transport_(transport) { transport_.cork(); }
  ~Corked() { transport_.uncork(); }
  Corked(const Corked&) = delete;
  Corked& operator=(const Corked&) = delete;

 private:
  Transport& transport_;
};

enum class TransportKind : std::uint8_t { kAuto, kUring, kSgio };

// io_uring on /dev/sgN. Fails with kNotSupported when the kernel refuses io_uring (EPERM from
// kernel.io_uring_disabled or a seccomp filter, ENOSYS, ENOMEM from the memlock limit).
[[nodiscard]] Result<std::unique_ptr<Transport>> make_uring_transport();
// Blocking SG_IO on a bounded pool of threads.
[[nodiscard]] Result<std::unique_ptr<Transport>> make_sgio_transport(std::size_t threads = 4);
// kAuto: io_uring when the kernel allows it, else SG_IO.
[[nodiscard]] Result<std::unique_ptr<Transport>> make_transport(TransportKind kind);

// Submits every command and reaps until each has completed (or become indeterminate). Completions
// come back in submission order, with the callers' tags. The batch must have the transport to
// itself (in_flight() == 0 on entry, else kInvalidArgument): it reaps whatever completes. If a
// submit fails, the commands already submitted are reaped and that error is returned; if reap()
// fails, its error is returned and the commands still in flight stay with the transport.
struct PathCommand {
  PathId path = 0;
  Command command;
};
[[nodiscard]] Result<std::vector<Completion>> run_batch(Transport& transport,
                                                        std::vector<PathCommand> commands);

}  // namespace blkfence::transport

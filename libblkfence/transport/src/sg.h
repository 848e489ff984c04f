// What the two sg transports share (transport layer, not installed): the check of a Command
// against what sg accepts, one request with the buffers the kernel reads and writes, and the
// classification of sg's answer into an Outcome.
//
// An SgRequest owns its sg_io_hdr, CDB, sense and data buffers at fixed addresses (it can be
// neither copied nor moved) from submit() until the kernel has given it back: sg reads the CDB and
// data-out when the header is written (write() or SG_IO) and writes sense and data-in when the
// answer is read (sg.c: sg_new_read(); blk_rq_unmap_user() copies data-in in the reader's context),
// so neither a deadline nor a close may free it while the kernel still holds it. Not thread-safe:
// one owner at a time (the transport's thread, or the SG_IO worker that runs it).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <scsi/sg.h>

#include "blkfence/error.h"
#include "blkfence/transport/transport.h"
#include "blkfence/unique_fd.h"

namespace blkfence::transport::detail {

using Clock = std::chrono::steady_clock;

// A path's fd: opened O_RDWR | O_NONBLOCK | O_CLOEXEC (sg's write()/read() need O_RDWR; O_NONBLOCK
// keeps both from sleeping), and whether it is an sg node (character major 21) or a block device.
// Anything else is refused with a message naming the device.
struct OpenedDevice {
  UniqueFd fd;
  bool is_sg = false;
};
[[nodiscard]] Result<OpenedDevice> open_device(const std::string& device);
// What fstat says of an open device fd (Transport::device_of()); nullopt if it fails.
std::optional<DeviceNumber> device_number_of(int fd);

// SPC-4 4.5.1: sense data is at most 252 bytes (8 + an ADDITIONAL SENSE LENGTH of 244). sg copies
// at most SCSI_SENSE_BUFFERSIZE (96) today; the buffer takes what any kernel may give.
inline constexpr std::size_t kSenseSizeMax = 252;
// PR IN allocation lengths are 16-bit; sg refuses dxfer_len >= 256 MiB. 1 MiB leaves room for
// anything a PR client sends or receives and keeps a bad length from pinning memory.
inline constexpr std::uint32_t kDataSizeMax = 1U << 20U;
// sg takes cmd_len 6..252 (sg.c: sg_write(), else EMSGSIZE); Command holds at most 16.
inline constexpr std::uint8_t kCdbSizeMin = 6;
// hdr.timeout is an unsigned int of milliseconds; 0 would mean the queue's default.
inline constexpr std::chrono::milliseconds kTimeoutMax{24L * 3600 * 1000};
// How long after Command::timeout the transport waits before it declares a command
// kIndeterminate: sg's own timeout starts SCSI error handling (abort, then resets), whose answer
// (DID_TIME_OUT) is also indeterminate, but usually arrives within this grace.
inline constexpr std::chrono::milliseconds kDeadlineGraceDefault{1000};

// sg.c: SG_MAX_QUEUE, at most 16 commands outstanding per fd; the 17th write() fails with EDOM.
inline constexpr std::size_t kSgQueueDepth = 16;

// What sg said about one command: the answer fields of its sg_io_hdr, or the errno of a failed
// write(), read() or ioctl(SG_IO).
struct SgAnswer {
  int os_errno = 0;                 // 0 when sg answered
  bool may_have_executed = false;   // with os_errno: the failure came after the command was issued
  std::uint8_t status = 0;          // sg_io_hdr.status, the full SAM status byte
  std::uint16_t host_status = 0;    // DID_*
  std::uint16_t driver_status = 0;  // DRIVER_* (low nibble) and suggestion bits
};

// The one mapping from what sg reports to an Outcome, shared by both transports. sg_io_hdr.info
// is not an input: SG_INFO_CHECK only summarises status, host_status and driver_status.
Outcome classify(const SgAnswer& answer);

// Checks a Command against what sg accepts, so that a bad one fails at submit() with a message
// instead of completing later with EINVAL.
[[nodiscard]] Result<void> check_command(const Command& command);

class SgRequest {
 public:
  // command must have passed check_command().
  SgRequest(Command command, std::int32_t pack_id, Clock::time_point submitted);
  SgRequest(const SgRequest&) = delete;
  SgRequest& operator=(const SgRequest&) = delete;

  // The header to write() or to pass to ioctl(SG_IO); its pointers lead into this object.
  sg_io_hdr& header() { return header_; }
  const Command& command() const { return command_; }
  std::int32_t pack_id() const { return header_.pack_id; }
  std::chrono::milliseconds timeout() const { return command_.timeout; }

  // The completion of an answered command, from the header sg returned (for write()/read() a copy
  // read into another buffer, for SG_IO header() itself) and the sense and data-in sg wrote into
  // this request's buffers. Lengths the kernel reports are clamped to the buffers.
  Completion answered(const sg_io_hdr& answer, Clock::time_point now) const;
  // The completion of a command sg never answered.
  Completion unanswered(Outcome outcome, int os_errno, Clock::time_point now) const;

 private:
  Command command_;  // cdb and data_out, which sg reads when the header is submitted
  std::vector<std::uint8_t> data_in_;
  std::array<std::uint8_t, kSenseSizeMax> sense_{};
  sg_io_hdr header_{};
  Clock::time_point submitted_;
};

}  // namespace blkfence::transport::detail

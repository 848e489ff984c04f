// Outcome names, Command::from_cdb and the classification of what sg reports (transport layer).
// Pure functions, thread-safe.
//
// classify() is the one place that decides what an sg answer means, for both transports. Its rule
// for fencing: kTransportError only where the host says the command never reached the LU, so that
// retrying it (on this or another path) cannot execute it twice; anything that may have reached
// the LU without a usable answer is kIndeterminate, and the caller re-reads state
// (docs/protocol.md, S4). Codes are those of 6.1 (include/scsi/scsi_status.h, scsi_error.c,
// scsi_lib.c).
#include <algorithm>

#include "blkfence/assert.h"
#include "blkfence/codec/sense.h"
#include "blkfence/transport/transport.h"

#include "sg.h"

namespace blkfence::transport {

std::string_view to_string(Outcome outcome) {
  switch (outcome) {
    case Outcome::kGood: return "GOOD";
    case Outcome::kCheckCondition: return "CHECK CONDITION";
    case Outcome::kReservationConflict: return "RESERVATION CONFLICT";
    case Outcome::kBusy: return "BUSY";
    case Outcome::kTaskAborted: return "TASK ABORTED";
    case Outcome::kTransportError: return "transport error";
    case Outcome::kOsError: return "OS error";
    case Outcome::kIndeterminate: return "indeterminate";
  }
  return "unknown outcome";
}

Command Command::from_cdb(std::span<const std::uint8_t> cdb_bytes) {
  BLKFENCE_ASSERT(cdb_bytes.size() <= kCdbSizeMax);
  Command command;
  std::copy(cdb_bytes.begin(), cdb_bytes.end(), command.cdb.begin());
  command.cdb_size = static_cast<std::uint8_t>(cdb_bytes.size());
  return command;
}

namespace detail {
namespace {

// include/scsi/scsi_status.h: enum host_status.
enum class HostStatus : std::uint16_t {
  kOk = 0x00,           // DID_OK
  kNoConnect = 0x01,    // DID_NO_CONNECT: device offline or gone, not dispatched
  kBusBusy = 0x02,      // DID_BUS_BUSY: could not be sent
  kTimeOut = 0x03,      // DID_TIME_OUT: the midlayer timed it out (scsi_error.c: scsi_timeout)
  kBadTarget = 0x04,    // DID_BAD_TARGET: no such target, not dispatched
  kAbort = 0x05,        // DID_ABORT: aborted by error handling, possibly after it ran
  kParity = 0x06,       // DID_PARITY
  kError = 0x07,        // DID_ERROR: the LLD failed it somewhere on the way
  kReset = 0x08,        // DID_RESET: a reset hit it in flight
  kBadIntr = 0x09,      // DID_BAD_INTR
  kPassthrough = 0x0a,  // DID_PASSTHROUGH
  kSoftError = 0x0b,    // DID_SOFT_ERROR: the LLD asks for a retry, state unknown
  kImmRetry = 0x0c,     // DID_IMM_RETRY: not dispatched, retry
  kRequeue = 0x0d,      // DID_REQUEUE: not dispatched, requeue
  kTransportDisrupted = 0x0e,  // DID_TRANSPORT_DISRUPTED: the link dropped with it in flight
  kTransportFailfast = 0x0f,   // DID_TRANSPORT_FAILFAST: the transport is down, failed fast
  kTargetFailure = 0x10,       // DID_TARGET_FAILURE: the device answered (sense says why)
  kNexusFailure = 0x11,        // DID_NEXUS_FAILURE: scsi_decide_disposition() on RESERVATION
                               // CONFLICT; scsi_result_to_blk_status() resets it to DID_OK
  kAllocFailure = 0x12,        // DID_ALLOC_FAILURE: the device answered (space allocation)
  kMediumError = 0x13,         // DID_MEDIUM_ERROR: the device answered (medium error)
  kTransportMarginal = 0x14,   // DID_TRANSPORT_MARGINAL: path marked marginal, failed fast
};

// Pre-5.14 kernels also reported in the driver byte (include/scsi/scsi.h then: DRIVER_*). Only the
// low nibble is the code; DRIVER_SENSE (0x08) says sense was copied, and sg 6.1 still sets it
// (sg_new_read()).
constexpr std::uint16_t kDriverCodeMask = 0x07;  // DRIVER_TIMEOUT is 0x06

Outcome classify_status(std::uint8_t status) {
  using codec::SamStatus;
  switch (static_cast<SamStatus>(status)) {
    case SamStatus::kGood:
    case SamStatus::kConditionMet: return Outcome::kGood;
    case SamStatus::kCheckCondition: return Outcome::kCheckCondition;
    case SamStatus::kReservationConflict: return Outcome::kReservationConflict;
    case SamStatus::kBusy:
    case SamStatus::kTaskSetFull:
    case SamStatus::kAcaActive: return Outcome::kBusy;
    case SamStatus::kTaskAborted: return Outcome::kTaskAborted;
  }
  // Obsolete (INTERMEDIATE, COMMAND TERMINATED) or reserved codes: the LU answered something we
  // cannot read, so whether the command took effect is unknown.
  return Outcome::kIndeterminate;
}

}  // namespace

Outcome classify(const SgAnswer& answer) {
  if (answer.os_errno != 0) {
    return answer.may_have_executed ? Outcome::kIndeterminate : Outcome::kOsError;
  }
  switch (static_cast<HostStatus>(answer.host_status)) {
    case HostStatus::kOk:
    case HostStatus::kTargetFailure:
    case HostStatus::kAllocFailure:
    case HostStatus::kMediumError: break;  // the LU answered: the status byte says how
    case HostStatus::kNexusFailure: return Outcome::kReservationConflict;
    case HostStatus::kNoConnect:
    case HostStatus::kBusBusy:
    case HostStatus::kBadTarget:
    case HostStatus::kImmRetry:
    case HostStatus::kRequeue:
    case HostStatus::kTransportFailfast:
    case HostStatus::kTransportMarginal: return Outcome::kTransportError;
    case HostStatus::kTimeOut:
    case HostStatus::kAbort:
    case HostStatus::kParity:
    case HostStatus::kError:
    case HostStatus::kReset:
    case HostStatus::kBadIntr:
    case HostStatus::kPassthrough:
    case HostStatus::kSoftError:
    case HostStatus::kTransportDisrupted:
    default:  // and any code newer than this table
      return Outcome::kIndeterminate;
  }
  // DRIVER_TIMEOUT is the old kernels' DID_TIME_OUT; DRIVER_BUSY, _SOFT, _MEDIA, _ERROR, _INVALID
  // and _HARD do not say that the command stayed on the host either.
  if ((answer.driver_status & kDriverCodeMask) != 0) {
    return Outcome::kIndeterminate;
  }
  return classify_status(answer.status);
}

}  // namespace detail
}  // namespace blkfence::transport

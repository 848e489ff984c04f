// SAM status, sense data and its classification for retry policy (codec layer).
//
// decode_sense() first normalises fixed (70h/71h) and descriptor (72h/73h) sense data into one
// Sense, then classify() maps it to a category the pr layer's retry policy switches on
// (docs/reference/spc4-pr.md §8), as sg3_utils does (sg_lib.c: sg_scsi_normalize_sense(),
// sg_err_category_sense()). Sense that is short or garbage decodes as far as it goes and says so;
// it is never an error, since the command's status is what counts. Pure, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "blkfence/endian.h"

namespace blkfence::codec {

// SAM-5 5.3: the status byte.
enum class SamStatus : std::uint8_t {
  kGood = 0x00,
  kCheckCondition = 0x02,
  kConditionMet = 0x04,
  kBusy = 0x08,
  kReservationConflict = 0x18,
  kTaskSetFull = 0x28,
  kAcaActive = 0x30,
  kTaskAborted = 0x40,
};

// SPC-4 4.5.6: SENSE KEY.
enum class SenseKey : std::uint8_t {
  kNoSense = 0x0,
  kRecoveredError = 0x1,
  kNotReady = 0x2,
  kMediumError = 0x3,
  kHardwareError = 0x4,
  kIllegalRequest = 0x5,
  kUnitAttention = 0x6,
  kDataProtect = 0x7,
  kBlankCheck = 0x8,
  kVendorSpecific = 0x9,
  kCopyAborted = 0xa,
  kAbortedCommand = 0xb,
  kObsolete = 0xc,
  kVolumeOverflow = 0xd,
  kMiscompare = 0xe,
  kCompleted = 0xf,
};

enum class SenseFormat : std::uint8_t {
  kUnknown,     // empty, or a response code other than 70h-73h: nothing else was decoded
  kFixed,       // 70h current, 71h deferred
  kDescriptor,  // 72h current, 73h deferred
};

struct Sense {
  SenseFormat format = SenseFormat::kUnknown;
  std::uint8_t response_code = 0;  // byte 0, bits 6-0
  bool deferred = false;           // the error belongs to an earlier command
  SenseKey sense_key = SenseKey::kNoSense;
  std::uint8_t asc = 0;
  std::uint8_t ascq = 0;
  std::optional<std::uint64_t> information;  // INFORMATION, when the device marked it valid
  // Some field above could not be read (the buffer or ADDITIONAL SENSE LENGTH ended first), or the
  // buffer ended before ADDITIONAL SENSE LENGTH did.
  bool truncated = false;

  friend bool operator==(const Sense&, const Sense&) = default;
};

Sense decode_sense(Bytes sense);

enum class SenseCategory : std::uint8_t {
  kNoSense,                // NO SENSE
  kRecovered,              // RECOVERED ERROR: the command completed
  kUnitAttention,          // retry; the ASC/ASCQ is only a hint (LIO reports one UA, clears all)
  kNotReadyBecomingReady,  // 04/01: retry with back-off
  kNotReadyInProgress,     // 04/07: retry with back-off (libmpathpersist does)
  kNotReadyTransitioning,  // 04/0A, ALUA state transition: retry with back-off
  kNotReady,               // any other NOT READY, e.g. LIO's PR 08/00: state may have changed
  kIllegalRequest,         // a bug or an unsupported feature: do not retry
  kAbortedCommand,
  kMediumOrHardware,
  kDataProtect,
  kOther,  // any other sense key, or sense that could not be decoded
};

SenseCategory classify(const Sense& sense);

std::string_view to_string(SamStatus status);  // "RESERVATION CONFLICT"
std::string_view to_string(SenseKey key);      // "UNIT ATTENTION"

}  // namespace blkfence::codec

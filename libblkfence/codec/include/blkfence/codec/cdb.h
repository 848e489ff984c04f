// Command descriptor block vocabulary shared by the codec (codec layer).
//
// Operation codes, PERSISTENT RESERVE service actions and reservation types, each with the explicit
// wire value SPC-4 gives it. A CDB is a fixed-size array the caller owns until the command
// completes. PrType is the SCSI TYPE field (1, 3, 5, 6, 7, 8), never the block layer's
// `enum pr_type` (1..6): the kernel converts between them (sd.c: sd_pr_type()), and mixing the two
// reserves the wrong type. Pure values and functions, thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace blkfence::codec {

using Cdb6 = std::array<std::uint8_t, 6>;
using Cdb10 = std::array<std::uint8_t, 10>;

enum class OpCode : std::uint8_t {
  kInquiry = 0x12,
  kPersistentReserveIn = 0x5e,
  kPersistentReserveOut = 0x5f,
};

// SPC-4 6.15.1: PERSISTENT RESERVE IN service actions (CDB byte 1, bits 4-0).
enum class PrInAction : std::uint8_t {
  kReadKeys = 0x00,
  kReadReservation = 0x01,
  kReportCapabilities = 0x02,
  kReadFullStatus = 0x03,
};

// SPC-4 6.16.2: PERSISTENT RESERVE OUT service actions (CDB byte 1, bits 4-0). REPLACE LOST
// RESERVATION (08h) is left out: LIO rejects it (docs/reference/lio.md §1).
enum class PrOutAction : std::uint8_t {
  kRegister = 0x00,
  kReserve = 0x01,
  kRelease = 0x02,
  kClear = 0x03,
  kPreempt = 0x04,
  kPreemptAndAbort = 0x05,
  kRegisterAndIgnoreExistingKey = 0x06,
  kRegisterAndMove = 0x07,
};

// SPC-4 6.16.2: persistent reservation TYPE codes (CDB byte 2, bits 3-0). 0h, 2h and 4h are
// obsolete; a decoded PrType may hold them (or any 4-bit value) as the device sent it.
enum class PrType : std::uint8_t {
  kWriteExclusive = 0x1,
  kExclusiveAccess = 0x3,
  kWriteExclusiveRegistrantsOnly = 0x5,
  kExclusiveAccessRegistrantsOnly = 0x6,
  kWriteExclusiveAllRegistrants = 0x7,
  kExclusiveAccessAllRegistrants = 0x8,
};

// SPC-4 5.13.10: under an all-registrants type every registrant holds the reservation and READ
// RESERVATION reports key 0.
constexpr bool is_all_registrants(PrType type) {
  return type == PrType::kWriteExclusiveAllRegistrants ||
         type == PrType::kExclusiveAccessAllRegistrants;
}

// The names sg_persist prints ("Write Exclusive, registrants only"); "obsolete or unknown" else.
std::string_view to_string(PrType type);
// Upper-case SPC-4 names ("PREEMPT AND ABORT"), for messages.
std::string_view to_string(PrOutAction action);
std::string_view to_string(PrInAction action);

}  // namespace blkfence::codec

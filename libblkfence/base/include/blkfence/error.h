// The error type every fallible libblkfence function returns (base layer).
//
// An Error says what went wrong (code), the errno when the OS reported one, the SCSI outcome when a
// device answered, and where it happened. The library never logs or throws: it returns these and
// the daemon or CLI reports them once, at the boundary. Value type, thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <tl/expected.hpp>

namespace blkfence {

enum class ErrorCode : std::uint8_t {
  kInvalidArgument,      // the caller passed something malformed (a bad key, an unknown name)
  kOs,                   // a system call failed; errno says why
  kScsi,                 // the device answered with a non-GOOD status; scsi says how
  kReservationConflict,  // the device answered RESERVATION CONFLICT
  kTruncated,            // a device response was shorter than its own length fields claim
  kIndeterminate,        // no answer before the deadline: the command may still execute later
  kNotSupported,         // the device or kernel lacks the feature
  kBusy,                 // another operation on the same resource is in progress
  kLost,                 // another node holds the resource (acquire lost a race, or we were fenced)
  kCancelled,            // the caller went away or its deadline passed before the operation ended
  kKeyInUse,  // a key of this node is registered by another initiator (a node_id used twice)
};

std::string_view to_string(ErrorCode code);

// What a SCSI device answered, when it answered at all.
struct ScsiOutcome {
  std::uint8_t status = 0;  // SAM status byte (0x02 CHECK CONDITION, 0x18 RESERVATION CONFLICT...)
  std::uint8_t sense_key = 0;  // from normalised sense data, when status is CHECK CONDITION
  std::uint8_t asc = 0;
  std::uint8_t ascq = 0;
};

class Error {
 public:
  Error(ErrorCode code, std::string where) : code_(code), where_(std::move(where)) {}

  static Error os(int errno_value, std::string where);
  static Error scsi(ErrorCode code, ScsiOutcome outcome, std::string where);

  ErrorCode code() const { return code_; }
  int errno_value() const { return errno_; }
  const std::optional<ScsiOutcome>& scsi() const { return scsi_; }
  const std::string& where() const { return where_; }

  // One line for a human: "where: what (errno text | SCSI status and sense)".
  std::string message() const;

 private:
  ErrorCode code_;
  int errno_ = 0;
  std::optional<ScsiOutcome> scsi_;
  std::string where_;
};

template <class T>
using Result = tl::expected<T, Error>;

inline tl::unexpected<Error> fail(ErrorCode code, std::string where) {
  return tl::unexpected<Error>(Error(code, std::move(where)));
}

}  // namespace blkfence

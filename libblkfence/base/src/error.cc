// Construction and rendering of blkfence::Error (base layer). Pure, thread-safe.
#include "blkfence/error.h"

#include <cstdio>
#include <cstring>

namespace blkfence {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kOs: return "system error";
    case ErrorCode::kScsi: return "SCSI error";
    case ErrorCode::kReservationConflict: return "RESERVATION CONFLICT";
    case ErrorCode::kTruncated: return "truncated response";
    case ErrorCode::kIndeterminate: return "indeterminate (no answer before the deadline)";
    case ErrorCode::kNotSupported: return "not supported";
    case ErrorCode::kBusy: return "busy";
    case ErrorCode::kLost: return "held by another node";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kKeyInUse: return "key in use";
  }
  return "unknown error";
}

Error Error::os(int errno_value, std::string where) {
  Error error(ErrorCode::kOs, std::move(where));
  error.errno_ = errno_value;
  return error;
}

Error Error::scsi(ErrorCode code, ScsiOutcome outcome, std::string where) {
  Error error(code, std::move(where));
  error.scsi_ = outcome;
  return error;
}

std::string Error::message() const {
  std::string text = where_;
  text += ": ";
  text += to_string(code_);
  if (errno_ != 0) {
    text += " (";
    text += std::strerror(errno_);
    text += ")";
  }
  if (scsi_) {
    char detail[64];  // the longest rendering is 55 bytes: snprintf cannot truncate
    (void)std::snprintf(detail, sizeof detail,
                        " (status 0x%02x, sense key 0x%x, ASC/ASCQ %02x/%02x)", scsi_->status,
                        scsi_->sense_key, scsi_->asc, scsi_->ascq);
    text += detail;
  }
  return text;
}

}  // namespace blkfence

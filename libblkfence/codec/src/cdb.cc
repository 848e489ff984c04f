// Names of the CDB wire enums, for messages (codec layer). Pure, thread-safe.
#include "blkfence/codec/cdb.h"

namespace blkfence::codec {

std::string_view to_string(PrType type) {
  switch (type) {
    case PrType::kWriteExclusive: return "Write Exclusive";
    case PrType::kExclusiveAccess: return "Exclusive Access";
    case PrType::kWriteExclusiveRegistrantsOnly: return "Write Exclusive, registrants only";
    case PrType::kExclusiveAccessRegistrantsOnly: return "Exclusive Access, registrants only";
    case PrType::kWriteExclusiveAllRegistrants: return "Write Exclusive, all registrants";
    case PrType::kExclusiveAccessAllRegistrants: return "Exclusive Access, all registrants";
  }
  return "obsolete or unknown type";
}

std::string_view to_string(PrOutAction action) {
  switch (action) {
    case PrOutAction::kRegister: return "REGISTER";
    case PrOutAction::kReserve: return "RESERVE";
    case PrOutAction::kRelease: return "RELEASE";
    case PrOutAction::kClear: return "CLEAR";
    case PrOutAction::kPreempt: return "PREEMPT";
    case PrOutAction::kPreemptAndAbort: return "PREEMPT AND ABORT";
    case PrOutAction::kRegisterAndIgnoreExistingKey: return "REGISTER AND IGNORE EXISTING KEY";
    case PrOutAction::kRegisterAndMove: return "REGISTER AND MOVE";
  }
  return "unknown PR OUT service action";
}

std::string_view to_string(PrInAction action) {
  switch (action) {
    case PrInAction::kReadKeys: return "READ KEYS";
    case PrInAction::kReadReservation: return "READ RESERVATION";
    case PrInAction::kReportCapabilities: return "REPORT CAPABILITIES";
    case PrInAction::kReadFullStatus: return "READ FULL STATUS";
  }
  return "unknown PR IN service action";
}

}  // namespace blkfence::codec

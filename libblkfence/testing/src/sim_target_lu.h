// What the simulated target's parts share (private to sim_target*.cc): the commands it
// implements, the sense it answers with, LIO's reservation rules as predicates, and the state of
// one LU. See sim_target.cc for where every rule comes from.
#pragma once

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "blkfence/assert.h"
#include "blkfence/codec/prout.h"
#include "blkfence/codec/sense.h"
#include "blkfence/endian.h"
#include "blkfence/testing/sim_target.h"

namespace blkfence::transport::sim_lu {

using codec::PrOutAction;
using codec::SamStatus;
using codec::SenseKey;

// The operation codes the target implements (SPC-4, SBC-3).
enum class Op : std::uint8_t {
  kTestUnitReady = 0x00,
  kRequestSense = 0x03,
  kInquiry = 0x12,
  kRead10 = 0x28,
  kWrite10 = 0x2a,
  kPersistentReserveIn = 0x5e,
  kPersistentReserveOut = 0x5f,
  kRead16 = 0x88,
  kWrite16 = 0x8a,
  kReportLuns = 0xa0,
};

inline std::optional<std::uint8_t> cdb_size_of(std::uint8_t opcode) {
  switch (static_cast<Op>(opcode)) {
    case Op::kTestUnitReady:
    case Op::kRequestSense:
    case Op::kInquiry: return 6;
    case Op::kRead10:
    case Op::kWrite10:
    case Op::kPersistentReserveIn:
    case Op::kPersistentReserveOut: return 10;
    case Op::kReportLuns: return 12;
    case Op::kRead16:
    case Op::kWrite16: return 16;
  }
  return std::nullopt;
}

inline bool is_write(Op op) {
  return op == Op::kWrite10 || op == Op::kWrite16;
}

// Entries of LIO's sense_info_table[] (target_core_transport.c) the target answers with.
struct SenseReason {
  SenseKey key;
  std::uint8_t asc;
  std::uint8_t ascq;
};
constexpr SenseReason kInvalidOpcode{SenseKey::kIllegalRequest, 0x20, 0x00};
constexpr SenseReason kLbaOutOfRange{SenseKey::kIllegalRequest, 0x21, 0x00};
constexpr SenseReason kInvalidFieldInCdb{SenseKey::kIllegalRequest, 0x24, 0x00};
constexpr SenseReason kInvalidFieldInParameterList{SenseKey::kIllegalRequest, 0x26, 0x00};
constexpr SenseReason kParameterListLengthError{SenseKey::kIllegalRequest, 0x1a, 0x00};
// TCM_LOGICAL_UNIT_COMMUNICATION_FAILURE: NOT READY, so that initiators retry.
constexpr SenseReason kLuCommunicationFailure{SenseKey::kNotReady, 0x08, 0x00};

// SPC-4 4.5.3: fixed format, current error; LIO's default (D_SENSE 0 in the control mode page).
constexpr std::size_t kFixedSenseSize = 18;

inline std::vector<std::uint8_t> fixed_sense(SenseKey key, std::uint8_t asc, std::uint8_t ascq) {
  std::vector<std::uint8_t> sense(kFixedSenseSize, 0);
  sense[0] = 0x70;
  sense[2] = static_cast<std::uint8_t>(key);
  sense[7] = kFixedSenseSize - 8;  // ADDITIONAL SENSE LENGTH
  sense[12] = asc;
  sense[13] = ascq;
  return sense;
}

inline SimAnswer check_condition(SenseReason reason) {
  return {static_cast<std::uint8_t>(SamStatus::kCheckCondition),
          fixed_sense(reason.key, reason.asc, reason.ascq),
          {}};
}

// RESERVATION CONFLICT and TASK ABORTED carry no sense (target_core_transport.c).
inline SimAnswer status_only(SamStatus status) {
  return {static_cast<std::uint8_t>(status), {}, {}};
}

inline SimAnswer good(std::vector<std::uint8_t> data = {}, std::size_t transfer_max = 0) {
  data.resize(std::min(data.size(), transfer_max));
  return {static_cast<std::uint8_t>(SamStatus::kGood), {}, std::move(data)};
}

inline SimOutcome outcome_of(const SimAnswer& answer) {
  SimOutcome outcome;
  outcome.status = answer.status;
  if (!answer.sense.empty()) {
    const codec::Sense sense = codec::decode_sense(answer.sense);
    outcome.sense_key = static_cast<std::uint8_t>(sense.sense_key);
    outcome.asc = sense.asc;
    outcome.ascq = sense.ascq;
  }
  return outcome;
}

inline bool is_valid_type(std::uint8_t type) {
  switch (static_cast<codec::PrType>(type)) {
    case codec::PrType::kWriteExclusive:
    case codec::PrType::kExclusiveAccess:
    case codec::PrType::kWriteExclusiveRegistrantsOnly:
    case codec::PrType::kExclusiveAccessRegistrantsOnly:
    case codec::PrType::kWriteExclusiveAllRegistrants:
    case codec::PrType::kExclusiveAccessAllRegistrants: return true;
  }
  return false;
}

inline bool is_all_registrants(std::uint8_t type) {
  return codec::is_all_registrants(static_cast<codec::PrType>(type));
}

inline bool is_registrants_only(std::uint8_t type) {
  return type == static_cast<std::uint8_t>(codec::PrType::kWriteExclusiveRegistrantsOnly) ||
         type == static_cast<std::uint8_t>(codec::PrType::kExclusiveAccessRegistrantsOnly);
}

inline bool is_write_exclusive(std::uint8_t type) {
  return type == static_cast<std::uint8_t>(codec::PrType::kWriteExclusive) ||
         type == static_cast<std::uint8_t>(codec::PrType::kWriteExclusiveRegistrantsOnly) ||
         type == static_cast<std::uint8_t>(codec::PrType::kWriteExclusiveAllRegistrants);
}

// core_scsi3_pr_seq_non_holder(): whether a command from a nexus that does not hold the
// reservation conflicts with it. Explicitly allowed commands pass; everything else falls to the
// generic rules, where a write is any command whose data goes to the device (docs/reference/lio.md
// §3).
inline bool non_holder_conflicts(std::uint8_t type, bool registered, const Command& command) {
  bool conflict = true;
  bool other_cdb = false;
  switch (static_cast<Op>(command.cdb[0])) {
    case Op::kPersistentReserveOut:
      switch (static_cast<PrOutAction>(command.cdb[1] & 0x1fU)) {
        case PrOutAction::kClear:
        case PrOutAction::kPreempt:
        case PrOutAction::kPreemptAndAbort:
        case PrOutAction::kRelease: conflict = !registered; break;
        case PrOutAction::kRegister:
        case PrOutAction::kRegisterAndIgnoreExistingKey: conflict = false; break;
        case PrOutAction::kReserve:
        case PrOutAction::kRegisterAndMove: conflict = true; break;
        default: return true;  // LIO returns -EINVAL, which its caller takes for a conflict
      }
      break;
    case Op::kTestUnitReady:
    case Op::kInquiry:
    case Op::kReportLuns:
    case Op::kRequestSense:
    case Op::kPersistentReserveIn: conflict = false; break;
    default: other_cdb = true; break;
  }
  if (!conflict && !other_cdb) {
    return false;
  }
  const bool we = is_write_exclusive(type);
  if (we && !registered) {
    return command.direction == DataDirection::kToDevice;
  }
  if (is_registrants_only(type) || is_all_registrants(type)) {
    if (registered) {
      return false;
    }
  } else if (we && registered && command.direction == DataDirection::kFromDevice) {
    return false;
  }
  return true;
}

// core_scsi3_ua_allocate(): the new UA is compared with the head of the list only. A 29h UA goes
// first if its ASCQ is higher than a 29h head's; any 29h UA goes before a 2Ah head (so does one
// whose ASCQ exceeds the head's ASC, LIO's slip for ASCQ, which no code here reaches); the rest
// go last. Only a duplicate of the head is dropped.
inline void allocate_unit_attention(std::deque<UnitAttention>& list, UnitAttention ua) {
  if (list.empty()) {
    list.push_back(ua);
    return;
  }
  const UnitAttention head = list.front();
  if (head == ua) {
    return;
  }
  bool first = false;
  if (head.asc == 0x29) {
    first = ua.asc == 0x29 && ua.ascq > head.ascq;
  } else if (head.asc == 0x2a) {
    first = ua.asc == 0x29 || ua.ascq > head.asc;
  }
  if (first) {
    list.push_front(ua);
  } else {
    list.push_back(ua);
  }
}

// The byte length LIO executes with (cmd->data_length): the CDB's, or what the initiator
// actually transferred when that is less (target_cmd_size_check() takes an underflow).
inline std::uint32_t transfer_length(std::uint64_t cdb_length, std::size_t buffer_size) {
  return static_cast<std::uint32_t>(std::min<std::uint64_t>(cdb_length, buffer_size));
}

struct Parsed {
  std::optional<Op> op;  // nullopt: the opcode is not one the target implements
  std::uint64_t lba = 0;
  std::uint32_t blocks = 0;
};

struct Task {
  NexusId nexus = 0;
  Command command;
  Parsed parsed;
  // LIO's cmd->pr_res_key: the holder's key when the command passed its checks, 0 if there was
  // no reservation (target_scsi3_pr_reservation_check()). PREEMPT AND ABORT matches on this.
  std::uint64_t pr_res_key = 0;
  SimTime accepted_at{0};
  std::uint64_t accepted_sequence = 0;  // WriteRecord::accepted_sequence
  SimTarget::AnswerFn answer;
  SimClock::EventId event = 0;
};

struct Lu {
  struct Holder {
    NexusId nexus = 0;
    std::uint8_t type = 0;
  };

  LuId id = 0;
  LuConfig config;
  std::vector<SimRegistration> registrations;  // LIO's registration_list, in its order
  std::optional<Holder> holder;                // dev_pr_res_holder
  std::uint32_t generation = 0;                // wraps, as SPC-4 says
  bool aptpl_active = false;
  std::map<NexusId, std::deque<UnitAttention>> unit_attentions;
  std::set<NexusId> known;  // nexuses with a path here or that sent a command (an ACL with LUN)
  std::map<std::uint64_t, std::vector<std::uint8_t>> blocks;
  std::map<std::uint64_t, Task> tasks;  // held, by task id

  SimRegistration* find(NexusId nexus) {
    const auto it = std::find_if(registrations.begin(), registrations.end(),
                                 [nexus](const SimRegistration& r) { return r.nexus == nexus; });
    return it == registrations.end() ? nullptr : &*it;
  }
  const SimRegistration* find(NexusId nexus) const {
    const auto it = std::find_if(registrations.begin(), registrations.end(),
                                 [nexus](const SimRegistration& r) { return r.nexus == nexus; });
    return it == registrations.end() ? nullptr : &*it;
  }
  void unregister(NexusId nexus) {
    std::erase_if(registrations, [nexus](const SimRegistration& r) { return r.nexus == nexus; });
  }
  std::uint64_t key_of(NexusId nexus) const {
    const SimRegistration* registration = find(nexus);
    BLKFENCE_ASSERT(registration != nullptr);
    return registration->key;
  }
  // is_reservation_holder(): the holder, or any registrant under an all-registrants type.
  bool holds(NexusId nexus) const {
    return holder && (holder->nexus == nexus || is_all_registrants(holder->type));
  }
  std::optional<SimReservation> reservation() const {
    if (!holder) {
      return std::nullopt;
    }
    return SimReservation{holder->nexus, key_of(holder->nexus),
                          static_cast<codec::PrType>(holder->type)};
  }
  void add_unit_attention(NexusId nexus, UnitAttention ua) {
    allocate_unit_attention(unit_attentions[nexus], ua);
  }
};

// The fields of a PERSISTENT RESERVE OUT as target_scsi3_emulate_pr_out() reads them.
struct PrOut {
  std::uint8_t service_action = 0;
  std::uint8_t scope = 0;  // kept shifted, as LIO keeps it
  std::uint8_t type = 0;
  Bytes list;  // the parameter list, cmd->data_length bytes
  std::uint64_t key = 0;
  std::uint64_t sa_key = 0;
  bool spec_i_pt = false;
  bool all_tg_pt = false;
  bool aptpl = false;
  bool unreg = false;
};

inline PrOut read_prout(const Command& command) {
  const Bytes cdb(command.cdb.data(), command.cdb_size);
  PrOut prout;
  prout.service_action = cdb[1] & 0x1fU;
  prout.scope = cdb[2] & 0xf0U;
  prout.type = cdb[2] & 0x0fU;
  const std::uint32_t length = transfer_length(load_be32(cdb, 5), command.data_out.size());
  prout.list = Bytes(command.data_out.data(), length);
  if (length < codec::kPrOutBasicListSize) {
    return prout;
  }
  prout.key = load_be64(prout.list, 0);
  prout.sa_key = load_be64(prout.list, 8);
  if (prout.service_action != static_cast<std::uint8_t>(PrOutAction::kRegisterAndMove)) {
    prout.spec_i_pt = (prout.list[20] & 0x08U) != 0;
    prout.all_tg_pt = (prout.list[20] & 0x04U) != 0;
    prout.aptpl = (prout.list[20] & 0x01U) != 0;
  } else {
    prout.aptpl = (prout.list[17] & 0x01U) != 0;
    prout.unreg = (prout.list[17] & 0x02U) != 0;
  }
  return prout;
}

// The outcome of one PERSISTENT RESERVE OUT (sim_target_prout.cc): the answer, the nexuses it
// unregistered, and, for PREEMPT AND ABORT, the keys whose held commands are aborted.
struct PrOutResult {
  SimAnswer answer;
  std::vector<NexusId> unregistered;
  std::vector<std::uint64_t> abort_keys;
};

// Executes a PERSISTENT RESERVE OUT from nexus on lu as target_scsi3_emulate_pr_out() does.
PrOutResult execute_prout(Lu& lu, NexusId nexus, const Command& command);

}  // namespace blkfence::transport::sim_lu

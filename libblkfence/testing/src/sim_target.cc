// The simulated SPC-4 target (transport layer). Not thread-safe, like SimTarget.
//
// Every rule here is LIO's, function by function (drivers/target, Linux 6.1, which mainline
// matches on everything modelled): the order of checks is __target_execute_cmd()'s (the CDB
// first, then target_scsi3_ua_check(), then target_check_reservation()), and each PERSISTENT
// RESERVE OUT service action follows its core_scsi3_* handler in target_core_pr.c, including
// where LIO departs from SPC-4; those places say so. LIO identifies a registration by initiator
// ACL (and ISID); here a nexus is the identity, as it is for tcm_loop with one target per node.
// Not modelled: SPEC_I_PT (refused with 26/00, although REPORT CAPABILITIES says SIP_C as LIO's
// does), more than one target port (ALL_TG_PT registers through the only one), SPC-2
// RESERVE/RELEASE, and the APTPL file's contents (only whether writing it fails).
#include "blkfence/testing/sim_target.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "blkfence/assert.h"
#include "blkfence/codec/prout.h"
#include "blkfence/codec/sense.h"
#include "blkfence/endian.h"

namespace blkfence::transport {
namespace {

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

std::optional<std::uint8_t> cdb_size_of(std::uint8_t opcode) {
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

bool is_write(Op op) {
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

std::vector<std::uint8_t> fixed_sense(SenseKey key, std::uint8_t asc, std::uint8_t ascq) {
  std::vector<std::uint8_t> sense(kFixedSenseSize, 0);
  sense[0] = 0x70;
  sense[2] = static_cast<std::uint8_t>(key);
  sense[7] = kFixedSenseSize - 8;  // ADDITIONAL SENSE LENGTH
  sense[12] = asc;
  sense[13] = ascq;
  return sense;
}

SimAnswer check_condition(SenseReason reason) {
  return {static_cast<std::uint8_t>(SamStatus::kCheckCondition),
          fixed_sense(reason.key, reason.asc, reason.ascq),
          {}};
}

// RESERVATION CONFLICT and TASK ABORTED carry no sense (target_core_transport.c).
SimAnswer status_only(SamStatus status) {
  return {static_cast<std::uint8_t>(status), {}, {}};
}

SimAnswer good(std::vector<std::uint8_t> data = {}, std::size_t transfer_max = 0) {
  data.resize(std::min(data.size(), transfer_max));
  return {static_cast<std::uint8_t>(SamStatus::kGood), {}, std::move(data)};
}

SimOutcome outcome_of(const SimAnswer& answer) {
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

bool is_valid_type(std::uint8_t type) {
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

bool is_all_registrants(std::uint8_t type) {
  return codec::is_all_registrants(static_cast<codec::PrType>(type));
}

bool is_registrants_only(std::uint8_t type) {
  return type == static_cast<std::uint8_t>(codec::PrType::kWriteExclusiveRegistrantsOnly) ||
         type == static_cast<std::uint8_t>(codec::PrType::kExclusiveAccessRegistrantsOnly);
}

bool is_write_exclusive(std::uint8_t type) {
  return type == static_cast<std::uint8_t>(codec::PrType::kWriteExclusive) ||
         type == static_cast<std::uint8_t>(codec::PrType::kWriteExclusiveRegistrantsOnly) ||
         type == static_cast<std::uint8_t>(codec::PrType::kWriteExclusiveAllRegistrants);
}

// core_scsi3_pr_seq_non_holder(): whether a command from a nexus that does not hold the
// reservation conflicts with it. Explicitly allowed commands pass; everything else falls to the
// generic rules, where a write is any command whose data goes to the device (docs/reference/lio.md
// §3).
bool non_holder_conflicts(std::uint8_t type, bool registered, const Command& command) {
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
void allocate_unit_attention(std::deque<UnitAttention>& list, UnitAttention ua) {
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
std::uint32_t transfer_length(std::uint64_t cdb_length, std::size_t buffer_size) {
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

// sbc_parse_cdb() and spc_parse_cdb(): what LIO refuses before it looks at unit attentions.
std::optional<SenseReason> parse(const LuConfig& config, const Command& command, Parsed& parsed) {
  if (command.cdb_size == 0) {
    return kInvalidOpcode;
  }
  const auto size = cdb_size_of(command.cdb[0]);
  if (!size) {
    return kInvalidOpcode;
  }
  parsed.op = static_cast<Op>(command.cdb[0]);
  if (command.cdb_size < *size) {
    return kInvalidFieldInCdb;
  }
  const Bytes cdb(command.cdb.data(), command.cdb_size);
  switch (*parsed.op) {
    case Op::kRead10:
    case Op::kWrite10:
      parsed.lba = load_be32(cdb, 2);
      parsed.blocks = load_be16(cdb, 7);
      break;
    case Op::kRead16:
    case Op::kWrite16:
      parsed.lba = load_be64(cdb, 2);
      parsed.blocks = load_be32(cdb, 10);
      break;
    default: return std::nullopt;
  }
  if (parsed.lba > config.block_count || parsed.blocks > config.block_count - parsed.lba) {
    return kLbaOutOfRange;
  }
  // LIO rejects a WRITE whose data-out does not match its TRANSFER LENGTH (target_cmd_size_check).
  if (is_write(*parsed.op) &&
      command.data_out.size() != std::uint64_t{parsed.blocks} * config.block_size) {
    return kInvalidFieldInCdb;
  }
  return std::nullopt;
}

// REQUEST SENSE reports (and clears) the unit attentions as CHECK CONDITION would.
std::vector<std::uint8_t> take_unit_attention_sense(Lu& lu, NexusId nexus) {
  auto& list = lu.unit_attentions[nexus];
  if (list.empty()) {
    return fixed_sense(SenseKey::kNoSense, 0, 0);
  }
  const UnitAttention head = list.front();
  list.clear();
  return fixed_sense(SenseKey::kUnitAttention, head.asc, head.ascq);
}

// spc_emulate_inquiry(): standard data, VPD 0x00, 0x80 (serial, NUL-terminated as LIO's) and 0x83
// (NAA 6h, T10 vendor ID and relative target port, a subset of spc_emulate_evpd_83()).
SimAnswer inquiry(const Lu& lu, const Command& command) {
  const Bytes cdb(command.cdb.data(), command.cdb_size);
  const bool evpd = (cdb[1] & 0x01U) != 0;
  const std::uint8_t page = cdb[2];
  const std::uint32_t length = transfer_length(load_be16(cdb, 3), command.data_in_size);
  std::vector<std::uint8_t> data;
  const std::string vendor = "LIO-ORG ";
  if (!evpd) {
    if (page != 0) {
      return check_condition(kInvalidFieldInCdb);
    }
    data.assign(36, ' ');
    data[0] = 0x00;  // direct access block device
    data[1] = 0x00;
    data[2] = 0x06;  // SPC-4
    data[3] = 0x02;  // RESPONSE DATA FORMAT
    data[4] = 31;    // ADDITIONAL LENGTH
    data[5] = 0x00;
    data[6] = 0x00;
    data[7] = 0x02;  // CMDQUE
    std::copy(vendor.begin(), vendor.end(), data.begin() + 8);
    const std::string product = lu.config.product.substr(0, 16);
    std::copy(product.begin(), product.end(), data.begin() + 16);
    const std::string revision = "4.0 ";
    std::copy(revision.begin(), revision.end(), data.begin() + 32);
    return good(std::move(data), length);
  }
  data = {0x00, page, 0x00, 0x00};
  switch (page) {
    case 0x00: data.insert(data.end(), {0x00, 0x80, 0x83}); break;
    case 0x80:
      data.insert(data.end(), lu.config.serial.begin(), lu.config.serial.end());
      data.push_back(0);
      break;
    case 0x83: {
      data.insert(data.end(), {0x01, 0x03, 0x00, 0x10});  // binary, LU, NAA, 16 bytes
      data.insert(data.end(), lu.config.naa.begin(), lu.config.naa.end());
      const std::string t10 = vendor + lu.config.serial;
      data.insert(data.end(), {0x02, 0x01, 0x00, static_cast<std::uint8_t>(t10.size())});
      data.insert(data.end(), t10.begin(), t10.end());
      // SAS, binary, PIV, target port, relative target port.
      data.insert(data.end(), {0x61, 0x94, 0x00, 0x04, 0x00, 0x00, 0x00,
                               static_cast<std::uint8_t>(SimTarget::kRelativeTargetPortId)});
      break;
    }
    default: return check_condition(kInvalidFieldInCdb);
  }
  store_be16(data, 2, static_cast<std::uint16_t>(data.size() - 4));
  return good(std::move(data), length);
}

// spc_emulate_report_luns(): this nexus sees the one LU as LUN 0.
SimAnswer report_luns(const Command& command) {
  const Bytes cdb(command.cdb.data(), command.cdb_size);
  const std::uint32_t length = transfer_length(load_be32(cdb, 6), command.data_in_size);
  if (length < 16) {
    return check_condition(kInvalidFieldInCdb);
  }
  std::vector<std::uint8_t> data(16, 0);
  store_be32(data, 0, 8);  // LUN LIST LENGTH
  return good(std::move(data), length);
}

// target_scsi3_emulate_pr_in() and its core_scsi3_pri_* handlers.
SimAnswer persistent_reserve_in(const Lu& lu, const Command& command) {
  const Bytes cdb(command.cdb.data(), command.cdb_size);
  const std::uint32_t length = transfer_length(load_be16(cdb, 7), command.data_in_size);
  std::vector<std::uint8_t> data(8, 0);
  store_be32(data, 0, lu.generation);
  switch (static_cast<codec::PrInAction>(cdb[1] & 0x1fU)) {
    case codec::PrInAction::kReadKeys: {
      if (length < 8) {
        return check_condition(kInvalidFieldInCdb);
      }
      // ADDITIONAL LENGTH counts every key; only whole keys that fit are copied.
      for (const SimRegistration& registration : lu.registrations) {
        data.resize(data.size() + 8);
        store_be64(data, data.size() - 8, registration.key);
      }
      store_be32(data, 4, static_cast<std::uint32_t>(data.size() - 8));
      const std::size_t whole = 8 + (std::max<std::uint32_t>(length, 8) - 8) / 8 * 8;
      std::fill(data.begin() + static_cast<std::ptrdiff_t>(std::min(whole, data.size())),
                data.end(), 0);
      return good(std::move(data), length);
    }
    case codec::PrInAction::kReadReservation: {
      if (length < 8) {
        return check_condition(kInvalidFieldInCdb);
      }
      if (!lu.holder) {
        return good(std::move(data), length);
      }
      store_be32(data, 4, 16);
      data.resize(24, 0);
      if (length < 22) {
        // LIO leaves after the header (goto err) without setting the data length: the whole
        // allocation is transferred, the key and type never written.
        data.resize(length, 0);
        return good(std::move(data), length);
      }
      // SPC-4 5.13.10: key 0 under an all-registrants type.
      store_be64(data, 8, is_all_registrants(lu.holder->type) ? 0 : lu.key_of(lu.holder->nexus));
      data[21] = lu.holder->type & 0x0fU;  // SCOPE 0 (LU_SCOPE)
      return good(std::move(data), length);
    }
    case codec::PrInAction::kReportCapabilities: {
      if (length < 6) {
        return check_condition(kInvalidFieldInCdb);
      }
      std::vector<std::uint8_t> caps(8, 0);
      store_be16(caps, 0, 8);
      caps[2] = 0x10 | 0x08 | 0x04 | 0x01;  // CRH, SIP_C, ATP_C, PTPL_C
      caps[3] = 0x80 | 0x10;                // TMV, ALLOW COMMANDS 001b
      if (lu.aptpl_active) {
        caps[3] |= 0x01;  // PTPL_A
      }
      caps[4] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;  // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX
      caps[5] = 0x01;                              // EX_AC_AR
      return good(std::move(caps), length);
    }
    case codec::PrInAction::kReadFullStatus: {
      if (length < 8) {
        return check_condition(kInvalidFieldInCdb);
      }
      const bool all_registrants = lu.holder && is_all_registrants(lu.holder->type);
      std::uint32_t additional_length = 0;
      for (const SimRegistration& registration : lu.registrations) {
        std::vector<std::uint8_t> transport_id;
        const auto appended =
            codec::append_transport_id(transport_id, SimTarget::initiator_port(registration.nexus));
        BLKFENCE_ASSERT(appended.has_value());
        // LIO's check counts the TransportID alone, not the 24-byte descriptor header: a
        // descriptor that passes may still be cut by the allocation length.
        if (transport_id.size() + additional_length > length) {
          break;
        }
        std::vector<std::uint8_t> descriptor(24, 0);
        store_be64(descriptor, 0, registration.key);
        const bool holder = lu.holder && lu.holder->nexus == registration.nexus;
        descriptor[12] = registration.all_tg_pt ? 0x02 : 0x00;
        if (holder || all_registrants) {
          descriptor[12] |= 0x01;  // R_HOLDER
          descriptor[13] = lu.holder->type & 0x0fU;
        }
        if (!registration.all_tg_pt) {
          store_be16(descriptor, 18, SimTarget::kRelativeTargetPortId);
        }
        store_be32(descriptor, 20, static_cast<std::uint32_t>(transport_id.size()));
        data.insert(data.end(), descriptor.begin(), descriptor.end());
        data.insert(data.end(), transport_id.begin(), transport_id.end());
        additional_length += static_cast<std::uint32_t>(descriptor.size() + transport_id.size());
      }
      store_be32(data, 4, additional_length);
      return good(std::move(data), length);
    }
  }
  return check_condition(kInvalidFieldInCdb);
}

SimAnswer read_blocks(const Lu& lu, const Command& command, const Parsed& parsed) {
  const std::uint32_t block_size = lu.config.block_size;
  std::vector<std::uint8_t> data(std::uint64_t{parsed.blocks} * block_size, 0);
  for (std::uint32_t i = 0; i < parsed.blocks; ++i) {
    if (const auto it = lu.blocks.find(parsed.lba + i); it != lu.blocks.end()) {
      std::copy(it->second.begin(), it->second.end(),
                data.begin() + static_cast<std::ptrdiff_t>(std::uint64_t{i} * block_size));
    }
  }
  // A READ may ask for less than it transfers: LIO sends what fits (an overflow, with residual).
  return good(std::move(data), command.data_in_size);
}

void write_blocks(Lu& lu, const Command& command, const Parsed& parsed) {
  const std::uint32_t block_size = lu.config.block_size;
  for (std::uint32_t i = 0; i < parsed.blocks; ++i) {
    const auto first =
        command.data_out.begin() + static_cast<std::ptrdiff_t>(std::uint64_t{i} * block_size);
    lu.blocks[parsed.lba + i].assign(first, first + block_size);
  }
}

// The TransportID of a REGISTER AND MOVE names a nexus by its SAS address.
std::optional<NexusId> nexus_of(const codec::TransportId& id) {
  if (id.protocol != codec::ProtocolId::kSas ||
      (id.port_name & 0xffffffff00000000ULL) != SimTarget::kInitiatorSasBase) {
    return std::nullopt;
  }
  return static_cast<NexusId>(id.port_name & 0xffffffffULL);
}

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

PrOut read_prout(const Command& command) {
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

// One PERSISTENT RESERVE OUT being executed on a LU: the core_scsi3_emulate_pro_* handlers.
class PrOutExecution {
 public:
  PrOutExecution(Lu& lu, NexusId nexus, const PrOut& prout) : lu_(lu), nexus_(nexus), in_(prout) {}

  SimAnswer run() {
    if (in_.list.size() < codec::kPrOutBasicListSize) {
      return check_condition(kParameterListLengthError);
    }
    const auto action = static_cast<PrOutAction>(in_.service_action);
    if (in_.spec_i_pt && action != PrOutAction::kRegister) {
      return check_condition(kInvalidFieldInParameterList);
    }
    if (!in_.spec_i_pt && action != PrOutAction::kRegisterAndMove &&
        in_.list.size() != codec::kPrOutBasicListSize) {
      return check_condition(kParameterListLengthError);
    }
    switch (action) {
      case PrOutAction::kRegister: return register_key(in_.key, false);
      case PrOutAction::kRegisterAndIgnoreExistingKey: return register_key(0, true);
      case PrOutAction::kReserve: return reserve();
      case PrOutAction::kRelease: return release();
      case PrOutAction::kClear: return clear();
      case PrOutAction::kPreempt: return preempt(false);
      case PrOutAction::kPreemptAndAbort: return preempt(true);
      case PrOutAction::kRegisterAndMove: return register_and_move();
    }
    return check_condition(kInvalidFieldInCdb);  // REPLACE LOST RESERVATION and unknown actions
  }

  const std::vector<NexusId>& unregistered() const { return unregistered_; }
  // PREEMPT AND ABORT: held commands whose pr_res_key is one of these are aborted.
  const std::vector<std::uint64_t>& abort_keys() const { return abort_keys_; }

 private:
  static SimAnswer conflict() { return status_only(SamStatus::kReservationConflict); }

  void remove(NexusId nexus) {
    if (aborting_) {
      abort_keys_.push_back(lu_.key_of(nexus));
    }
    lu_.unregister(nexus);
    unregistered_.push_back(nexus);
  }

  // core_scsi3_update_and_write_aptpl(): the APTPL file is rewritten; LIO marks APTPL inactive
  // whatever the write did, and active only when it worked.
  SimAnswer write_aptpl(bool aptpl) {
    if (!aptpl) {
      lu_.aptpl_active = false;
    } else if (lu_.config.aptpl_file_writable) {
      lu_.aptpl_active = true;
    }
    return lu_.config.aptpl_file_writable ? good() : check_condition(kLuCommunicationFailure);
  }

  // core_scsi3_emulate_pro_register(); REGISTER AND IGNORE EXISTING KEY comes with key 0.
  SimAnswer register_key(std::uint64_t key, bool ignore_existing) {
    SimRegistration* registration = lu_.find(nexus_);
    if (registration == nullptr) {
      if (key != 0) {
        return conflict();
      }
      if (in_.sa_key == 0) {
        return good();  // nothing to do, and LIO does not bump PRgeneration or write APTPL
      }
      if (in_.spec_i_pt) {
        return check_condition(kInvalidFieldInParameterList);  // not modelled
      }
      lu_.registrations.push_back({nexus_, in_.sa_key, in_.all_tg_pt});
      ++lu_.generation;
      return write_aptpl(in_.aptpl);
    }
    if (!ignore_existing && key != registration->key) {
      return conflict();
    }
    if (in_.spec_i_pt) {
      return check_condition(kInvalidFieldInParameterList);
    }
    if (registration->all_tg_pt && !in_.all_tg_pt) {
      return check_condition(kInvalidFieldInCdb);
    }
    if (in_.sa_key != 0) {
      ++lu_.generation;
      registration->key = in_.sa_key;
      return write_aptpl(in_.aptpl);
    }
    // Unregister. The holder of a reservation releases it (core_scsi3_check_implicit_release());
    // under an all-registrants type LIO hands it to the first remaining registration.
    const bool was_holder = lu_.holder && lu_.holder->nexus == nexus_;
    const std::uint8_t held_type = was_holder ? lu_.holder->type : 0;
    lu_.unregister(nexus_);
    unregistered_.push_back(nexus_);
    // No PRgeneration bump: __core_scsi3_free_registration() has none (SPC-4 wants one).
    if (was_holder) {
      lu_.holder.reset();
      if (is_all_registrants(held_type) && !lu_.registrations.empty()) {
        lu_.holder = Lu::Holder{lu_.registrations.front().nexus, held_type};
      }
      if (is_registrants_only(held_type)) {
        for (const SimRegistration& other : lu_.registrations) {
          lu_.add_unit_attention(other.nexus, kUaReservationsReleased);
        }
      }
    }
    return write_aptpl(in_.aptpl);
  }

  // core_scsi3_emulate_pro_reserve() and core_scsi3_pro_reserve().
  SimAnswer reserve() {
    if (!is_valid_type(in_.type)) {
      return check_condition(kInvalidFieldInCdb);
    }
    const SimRegistration* registration = lu_.find(nexus_);
    if (registration == nullptr) {
      return check_condition(kLuCommunicationFailure);  // SPC-4 says RESERVATION CONFLICT
    }
    if (in_.key != registration->key) {
      return conflict();
    }
    if (in_.scope != 0) {
      return check_condition(kInvalidFieldInParameterList);
    }
    if (lu_.holder) {
      // Another holder, or the holder changing TYPE: conflict. The same TYPE again: GOOD, as is
      // a RESERVE of the same AR type by any registrant.
      if (!lu_.holds(nexus_) || lu_.holder->type != in_.type) {
        return conflict();
      }
      return good();
    }
    lu_.holder = Lu::Holder{nexus_, in_.type};
    return good();
  }

  // core_scsi3_emulate_pro_release().
  SimAnswer release() {
    const SimRegistration* registration = lu_.find(nexus_);
    if (registration == nullptr) {
      return check_condition(kLuCommunicationFailure);
    }
    // No reservation, or a registrant that does not hold it: GOOD, nothing changes.
    if (!lu_.holder || !lu_.holds(nexus_)) {
      return good();
    }
    if (in_.key != registration->key) {
      return conflict();
    }
    // SPC-4 wants ILLEGAL REQUEST 26/04 INVALID RELEASE OF PERSISTENT RESERVATION here.
    if (lu_.holder->type != in_.type || in_.scope != 0) {
      return conflict();
    }
    const std::uint8_t type = lu_.holder->type;
    lu_.holder.reset();
    if (is_registrants_only(type) || is_all_registrants(type)) {
      for (const SimRegistration& other : lu_.registrations) {
        if (other.nexus != nexus_) {
          lu_.add_unit_attention(other.nexus, kUaReservationsReleased);
        }
      }
    }
    return good();
  }

  // core_scsi3_emulate_pro_clear().
  SimAnswer clear() {
    const SimRegistration* registration = lu_.find(nexus_);
    if (registration == nullptr) {
      return check_condition(kLuCommunicationFailure);
    }
    if (in_.key != registration->key) {
      return conflict();
    }
    lu_.holder.reset();
    for (const SimRegistration& removed : lu_.registrations) {
      unregistered_.push_back(removed.nexus);
      if (removed.nexus != nexus_) {
        lu_.add_unit_attention(removed.nexus, kUaReservationsPreempted);
      }
    }
    lu_.registrations.clear();
    (void)write_aptpl(false);  // LIO ignores the result here
    ++lu_.generation;
    return good();
  }

  // core_scsi3_emulate_pro_preempt() and core_scsi3_pro_preempt() (docs/reference/spc4-pr.md §4,
  // lio.md §4).
  SimAnswer preempt(bool abort) {
    if (!is_valid_type(in_.type)) {
      return check_condition(kInvalidFieldInCdb);  // even where TYPE is then ignored
    }
    const SimRegistration* caller = lu_.find(nexus_);
    if (caller == nullptr || caller->key != in_.key) {
      return conflict();
    }
    if (in_.scope != 0) {
      return check_condition(kInvalidFieldInParameterList);
    }
    aborting_ = abort;
    const std::uint64_t caller_key = caller->key;
    const bool all_registrants = lu_.holder && is_all_registrants(lu_.holder->type);
    if (!all_registrants && in_.sa_key == 0) {
      return check_condition(kInvalidFieldInParameterList);
    }
    const std::vector<SimRegistration> before = lu_.registrations;
    if (!lu_.holder || lu_.key_of(lu_.holder->nexus) != in_.sa_key) {
      // The SA key names no holder: remove its registrations, TYPE ignored. Without an AR
      // reservation that includes the caller's own when its key matches.
      bool unmatched = in_.sa_key != 0;
      for (const SimRegistration& registration : before) {
        const bool calling = registration.nexus == nexus_;
        if (in_.sa_key != 0 && registration.key != in_.sa_key) {
          continue;
        }
        unmatched = false;
        if (all_registrants && calling) {
          continue;
        }
        remove(registration.nexus);
        if (!calling) {
          lu_.add_unit_attention(registration.nexus, kUaRegistrationsPreempted);
        }
      }
      if (unmatched) {
        return conflict();  // a retried preempt that already worked ends here (spc4-pr.md §4)
      }
      if (all_registrants && in_.sa_key == 0) {
        lu_.holder = Lu::Holder{nexus_, in_.type};
        if (aborting_) {
          abort_keys_.push_back(caller_key);
        }
      }
      ++lu_.generation;
      return good();
    }
    // The SA key is the holder's: the reservation moves to the caller with the CDB's TYPE, and
    // every other registration with that key goes.
    const std::uint8_t previous_type = lu_.holder->type;
    lu_.holder.reset();
    for (const SimRegistration& registration : before) {
      if (registration.nexus == nexus_ || registration.key != in_.sa_key) {
        continue;
      }
      remove(registration.nexus);
      lu_.add_unit_attention(registration.nexus, kUaRegistrationsPreempted);
    }
    lu_.holder = Lu::Holder{nexus_, in_.type};
    if (aborting_) {
      // LIO adds the preemptor's own registration to the abort list, so its own commands
      // accepted under its key are aborted too (docs/reference/lio.md §4).
      abort_keys_.push_back(caller_key);
    }
    if (previous_type != in_.type) {
      for (const SimRegistration& other : lu_.registrations) {
        if (other.nexus != nexus_) {
          lu_.add_unit_attention(other.nexus, kUaReservationsReleased);
        }
      }
    }
    ++lu_.generation;
    return good();
  }

  // core_scsi3_emulate_pro_register_and_move(), with the checks in LIO's order.
  SimAnswer register_and_move() {
    const SimRegistration* registration = lu_.find(nexus_);
    if (registration == nullptr) {
      return check_condition(kLuCommunicationFailure);
    }
    if (in_.key != registration->key) {
      return conflict();
    }
    if (in_.sa_key == 0) {
      return check_condition(kInvalidFieldInParameterList);
    }
    const std::uint16_t relative_target_port_id = load_be16(in_.list, 18);
    const std::uint32_t transport_id_length = load_be32(in_.list, 20);
    if (std::uint64_t{transport_id_length} + 24 != in_.list.size() || transport_id_length == 0 ||
        relative_target_port_id != SimTarget::kRelativeTargetPortId ||
        static_cast<codec::ProtocolId>(in_.list[24] & 0x0fU) != codec::ProtocolId::kSas) {
      return check_condition(kInvalidFieldInParameterList);
    }
    const auto transport_id = codec::decode_transport_id(in_.list.subspan(24));
    if (!transport_id) {
      return check_condition(kInvalidFieldInParameterList);
    }
    const auto destination = nexus_of(*transport_id);
    if (!destination || !lu_.known.contains(*destination) || *destination == nexus_) {
      return check_condition(kInvalidFieldInParameterList);
    }
    if (!lu_.holder) {
      return check_condition(kInvalidFieldInCdb);
    }
    if (!lu_.holds(nexus_) || is_all_registrants(lu_.holder->type)) {
      return conflict();
    }
    const std::uint8_t type = lu_.holder->type;
    SimRegistration* moved_to = lu_.find(*destination);
    const bool new_registration = moved_to == nullptr;
    if (new_registration) {
      lu_.registrations.push_back({*destination, in_.sa_key, false});
      ++lu_.generation;
    } else {
      moved_to->key = in_.sa_key;
    }
    lu_.holder = Lu::Holder{*destination, type};
    if (!new_registration) {
      ++lu_.generation;
    }
    if (in_.unreg) {
      lu_.unregister(nexus_);
      unregistered_.push_back(nexus_);
    }
    (void)write_aptpl(in_.aptpl);  // LIO ignores the result here
    return good();
  }

  Lu& lu_;
  NexusId nexus_;
  const PrOut& in_;
  bool aborting_ = false;
  std::vector<NexusId> unregistered_;
  std::vector<std::uint64_t> abort_keys_;
};

std::string default_serial(LuId id) {
  return "sim-lu-" + std::to_string(id);
}

std::array<std::uint8_t, 16> default_naa(LuId id) {
  // NAA 6h, IEEE company ID 00-14-05 (LIO's, spc_gen_naa_6h_vendor_specific()), then the id.
  std::array<std::uint8_t, 16> naa{0x60, 0x01, 0x40, 0x50};
  store_be32(naa, 12, id);
  return naa;
}

}  // namespace

class SimTarget::Impl {
 public:
  explicit Impl(SimClock& clock) : clock_(clock) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    for (const auto& lu : lus_) {
      for (const auto& [id, task] : lu->tasks) {
        clock_.cancel(task.event);
      }
    }
  }

  Lu& lu(LuId id) const {
    BLKFENCE_ASSERT(id < lus_.size());
    return *lus_[id];
  }

  void submit(LuId lu_id, NexusId nexus, Command command, std::chrono::nanoseconds hold,
              AnswerFn answer) {
    BLKFENCE_ASSERT(answer);
    BLKFENCE_ASSERT(command.cdb_size <= Command::kCdbSizeMax);
    Lu& lu = this->lu(lu_id);
    lu.known.insert(nexus);
    const SimTime now = clock_.now();
    Parsed parsed;
    if (const auto reason = parse(lu.config, command, parsed)) {
      const SimAnswer refused = check_condition(*reason);
      finish(lu, nexus, command, parsed, now, refused, false, {});
      answer(refused);
      return;
    }
    // target_scsi3_ua_check(): the first UA is reported, all are cleared, and the command is not
    // executed; INQUIRY, REPORT LUNS and REQUEST SENSE are exempt.
    const Op op = *parsed.op;
    auto& unit_attentions = lu.unit_attentions[nexus];
    if (op != Op::kInquiry && op != Op::kReportLuns && op != Op::kRequestSense &&
        !unit_attentions.empty()) {
      const UnitAttention head = unit_attentions.front();
      unit_attentions.clear();
      SimAnswer refused{static_cast<std::uint8_t>(SamStatus::kCheckCondition),
                        fixed_sense(SenseKey::kUnitAttention, head.asc, head.ascq),
                        {}};
      finish(lu, nexus, command, parsed, now, refused, false, {});
      answer(std::move(refused));
      return;
    }
    // target_check_reservation(): the holder passes, others go through the non-holder rules.
    if (lu.holder && lu.holder->nexus != nexus &&
        non_holder_conflicts(lu.holder->type, lu.find(nexus) != nullptr, command)) {
      const SimAnswer refused = status_only(SamStatus::kReservationConflict);
      finish(lu, nexus, command, parsed, now, refused, false, {});
      answer(refused);
      return;
    }
    const std::uint64_t pr_res_key = lu.holder ? lu.key_of(lu.holder->nexus) : 0;
    if (hold.count() <= 0) {
      answer(run(lu, nexus, command, parsed, now));
      return;
    }
    const std::uint64_t id = next_task_id_++;
    const SimClock::EventId event =
        clock_.schedule_after(hold, [this, lu_id, id] { run_held(lu_id, id); });
    lu.tasks.emplace(
        id, Task{nexus, std::move(command), parsed, pr_res_key, now, std::move(answer), event});
  }

  SimAnswer run(Lu& lu, NexusId nexus, const Command& command, const Parsed& parsed,
                SimTime accepted_at) {
    BLKFENCE_ASSERT(parsed.op.has_value());
    SimAnswer answer;
    switch (*parsed.op) {
      case Op::kTestUnitReady: return good();
      case Op::kRequestSense: {
        const Bytes cdb(command.cdb.data(), command.cdb_size);
        return good(take_unit_attention_sense(lu, nexus),
                    transfer_length(cdb[4], command.data_in_size));
      }
      case Op::kInquiry: return inquiry(lu, command);
      case Op::kReportLuns: return report_luns(command);
      case Op::kRead10:
      case Op::kRead16: return read_blocks(lu, command, parsed);
      case Op::kWrite10:
      case Op::kWrite16:
        write_blocks(lu, command, parsed);
        answer = good();
        finish(lu, nexus, command, parsed, accepted_at, answer, true, {});
        return answer;
      case Op::kPersistentReserveIn: return persistent_reserve_in(lu, command);
      case Op::kPersistentReserveOut: {
        const PrOut prout = read_prout(command);
        PrOutExecution execution(lu, nexus, prout);
        answer = execution.run();
        finish(lu, nexus, command, parsed, accepted_at, answer, false, execution.unregistered());
        // core_tmr_lun_reset() runs after the registrations changed and before the PR OUT
        // completes, so its TASK ABORTED answers precede the preemptor's GOOD.
        if (!execution.abort_keys().empty()) {
          abort_held(lu, execution.abort_keys());
        }
        return answer;
      }
    }
    BLKFENCE_ASSERT(false);
    return answer;
  }

  void run_held(LuId lu_id, std::uint64_t id) {
    Lu& lu = this->lu(lu_id);
    auto node = lu.tasks.extract(id);
    BLKFENCE_ASSERT(!node.empty());
    Task& task = node.mapped();
    task.answer(run(lu, task.nexus, task.command, task.parsed, task.accepted_at));
  }

  // core_tmr_drain_state_list() with a preempt-and-abort list: held commands whose pr_res_key
  // matches are aborted with TASK ABORTED (emulate_tas=1); a key of 0 matches nothing.
  void abort_held(Lu& lu, const std::vector<std::uint64_t>& keys) {
    std::vector<Task> aborted;
    for (auto it = lu.tasks.begin(); it != lu.tasks.end();) {
      const std::uint64_t key = it->second.pr_res_key;
      if (key != 0 && std::find(keys.begin(), keys.end(), key) != keys.end()) {
        clock_.cancel(it->second.event);
        aborted.push_back(std::move(it->second));
        it = lu.tasks.erase(it);
      } else {
        ++it;
      }
    }
    for (Task& task : aborted) {
      const SimAnswer answer = status_only(SamStatus::kTaskAborted);
      finish(lu, task.nexus, task.command, task.parsed, task.accepted_at, answer, false, {});
      task.answer(answer);
    }
  }

  // Records writes and PR OUTs, whatever became of them.
  void finish(const Lu& lu, NexusId nexus, const Command& command, const Parsed& parsed,
              SimTime accepted_at, const SimAnswer& answer, bool landed,
              std::vector<NexusId> unregistered) {
    if (!parsed.op) {
      return;
    }
    if (is_write(*parsed.op)) {
      history_.writes.push_back(WriteRecord{next_sequence_++, clock_.now(), accepted_at, lu.id,
                                            nexus, parsed.lba, parsed.blocks, landed,
                                            outcome_of(answer)});
    } else if (*parsed.op == Op::kPersistentReserveOut && command.cdb_size >= 10) {
      const PrOut prout = read_prout(command);
      history_.prouts.push_back(
          PrOutRecord{next_sequence_++, clock_.now(), lu.id, nexus, prout.service_action,
                      prout.type, prout.key, prout.sa_key, outcome_of(answer),
                      std::move(unregistered), lu.generation, lu.reservation()});
    }
  }

  SimClock& clock_;
  std::vector<std::unique_ptr<Lu>> lus_;
  std::map<std::string, SimPath> paths_;
  std::uint64_t next_task_id_ = 1;
  std::uint64_t next_sequence_ = 0;
  SimHistory history_;
};

SimTarget::SimTarget(SimClock& clock) : impl_(std::make_unique<Impl>(clock)) {}

SimTarget::~SimTarget() = default;

SimClock& SimTarget::clock() const {
  return impl_->clock_;
}

LuId SimTarget::add_lu(LuConfig config) {
  const auto id = static_cast<LuId>(impl_->lus_.size());
  BLKFENCE_ASSERT(config.block_size > 0);
  if (config.serial.empty()) {
    config.serial = default_serial(id);
  }
  if (config.naa == std::array<std::uint8_t, 16>{}) {
    config.naa = default_naa(id);
  }
  auto lu = std::make_unique<Lu>();
  lu->id = id;
  lu->config = std::move(config);
  impl_->lus_.push_back(std::move(lu));
  return id;
}

std::size_t SimTarget::lu_count() const {
  return impl_->lus_.size();
}

void SimTarget::add_path(const std::string& device, LuId lu, NexusId nexus) {
  impl_->lu(lu).known.insert(nexus);
  const bool added = impl_->paths_.emplace(device, SimPath{lu, nexus}).second;
  BLKFENCE_ASSERT(added);
}

std::optional<SimPath> SimTarget::find_path(const std::string& device) const {
  const auto it = impl_->paths_.find(device);
  if (it == impl_->paths_.end()) {
    return std::nullopt;
  }
  return it->second;
}

SimAnswer SimTarget::execute(LuId lu, NexusId nexus, const Command& command) {
  std::optional<SimAnswer> answered;
  impl_->submit(lu, nexus, command, std::chrono::nanoseconds(0),
                [&answered](SimAnswer answer) { answered = std::move(answer); });
  BLKFENCE_ASSERT(answered.has_value());
  return std::move(*answered);
}

void SimTarget::submit(LuId lu, NexusId nexus, Command command, std::chrono::nanoseconds hold,
                       AnswerFn answer) {
  impl_->submit(lu, nexus, std::move(command), hold, std::move(answer));
}

void SimTarget::add_unit_attention(LuId lu, NexusId nexus, UnitAttention ua) {
  impl_->lu(lu).add_unit_attention(nexus, ua);
}

void SimTarget::nexus_loss(NexusId nexus) {
  for (const auto& lu : impl_->lus_) {
    lu->add_unit_attention(nexus, kUaItNexusLoss);
  }
}

std::vector<SimRegistration> SimTarget::registrations(LuId lu) const {
  return impl_->lu(lu).registrations;
}

std::optional<SimReservation> SimTarget::reservation(LuId lu) const {
  return impl_->lu(lu).reservation();
}

std::uint32_t SimTarget::generation(LuId lu) const {
  return impl_->lu(lu).generation;
}

std::vector<UnitAttention> SimTarget::unit_attentions(LuId lu, NexusId nexus) const {
  const Lu& state = impl_->lu(lu);
  const auto it = state.unit_attentions.find(nexus);
  if (it == state.unit_attentions.end()) {
    return {};
  }
  return {it->second.begin(), it->second.end()};
}

std::size_t SimTarget::held_count(LuId lu) const {
  return impl_->lu(lu).tasks.size();
}

std::optional<std::vector<std::uint8_t>> SimTarget::block(LuId lu, std::uint64_t lba) const {
  const Lu& state = impl_->lu(lu);
  const auto it = state.blocks.find(lba);
  if (it == state.blocks.end()) {
    return std::nullopt;
  }
  return it->second;
}

const SimHistory& SimTarget::history() const {
  return impl_->history_;
}

}  // namespace blkfence::transport

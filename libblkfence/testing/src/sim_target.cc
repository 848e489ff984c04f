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

#include "sim_target_lu.h"

namespace blkfence::transport {
namespace {

using namespace sim_lu;  // the target's own parts (sim_target_lu.h)

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
      caps[2] = 0x10 | 0x08 | 0x04;  // CRH, SIP_C, ATP_C
      if (lu.config.ptpl_capable) {
        caps[2] |= 0x01;  // PTPL_C
      }
      caps[3] = 0x80 | 0x10;  // TMV, ALLOW COMMANDS 001b
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
  // When a command passed its checks: the time, and the sequence the next record takes then.
  struct Accepted {
    SimTime at{0};
    std::uint64_t sequence = 0;
  };

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
      finish(lu, nexus, command, parsed, {now, next_sequence_}, refused, false, {});
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
      finish(lu, nexus, command, parsed, {now, next_sequence_}, refused, false, {});
      answer(std::move(refused));
      return;
    }
    // target_check_reservation(): the holder passes, others go through the non-holder rules.
    if (lu.holder && lu.holder->nexus != nexus &&
        non_holder_conflicts(lu.holder->type, lu.find(nexus) != nullptr, command)) {
      const SimAnswer refused = status_only(SamStatus::kReservationConflict);
      finish(lu, nexus, command, parsed, {now, next_sequence_}, refused, false, {});
      answer(refused);
      return;
    }
    const std::uint64_t pr_res_key = lu.holder ? lu.key_of(lu.holder->nexus) : 0;
    const Accepted accepted{now, next_sequence_};
    if (hold.count() <= 0) {
      answer(run(lu, nexus, command, parsed, accepted));
      return;
    }
    const std::uint64_t id = next_task_id_++;
    const SimClock::EventId event =
        clock_.schedule_after(hold, [this, lu_id, id] { run_held(lu_id, id); });
    lu.tasks.emplace(id, Task{nexus, std::move(command), parsed, pr_res_key, now, accepted.sequence,
                              std::move(answer), event});
  }

  SimAnswer run(Lu& lu, NexusId nexus, const Command& command, const Parsed& parsed,
                Accepted accepted) {
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
        finish(lu, nexus, command, parsed, accepted, answer, true, {});
        return answer;
      case Op::kPersistentReserveIn: return persistent_reserve_in(lu, command);
      case Op::kPersistentReserveOut: {
        PrOutResult prout = execute_prout(lu, nexus, command);
        answer = prout.answer;
        finish(lu, nexus, command, parsed, accepted, answer, false, prout.unregistered);
        // core_tmr_lun_reset() runs after the registrations changed and before the PR OUT
        // completes, so its TASK ABORTED answers precede the preemptor's GOOD.
        if (!prout.abort_keys.empty()) {
          abort_held(lu, prout.abort_keys);
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
    task.answer(
        run(lu, task.nexus, task.command, task.parsed, {task.accepted_at, task.accepted_sequence}));
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
      finish(lu, task.nexus, task.command, task.parsed, {task.accepted_at, task.accepted_sequence},
             answer, false, {});
      task.answer(answer);
    }
  }

  bool power_cycle(Lu& lu) {
    std::vector<Task> lost;
    for (auto& [id, task] : lu.tasks) {
      clock_.cancel(task.event);
      lost.push_back(std::move(task));
    }
    lu.tasks.clear();
    for (Task& task : lost) {
      const SimAnswer answer = status_only(SamStatus::kTaskAborted);
      finish(lu, task.nexus, task.command, task.parsed, {task.accepted_at, task.accepted_sequence},
             answer, false, {});
      task.answer(answer);
    }
    lu.unit_attentions.clear();
    for (const NexusId nexus : lu.known) {
      lu.add_unit_attention(nexus, kUaPowerOnOrReset);
    }
    if (lu.aptpl_active) {
      return true;
    }
    std::vector<NexusId> unregistered;
    for (const SimRegistration& registration : lu.registrations) {
      unregistered.push_back(registration.nexus);
    }
    lu.registrations.clear();
    lu.holder.reset();
    lu.generation = 0;
    history_.prouts.push_back(PrOutRecord{next_sequence_++, clock_.now(), lu.id, 0,
                                          kPowerCycleRecord, 0, 0, 0, SimOutcome{},
                                          std::move(unregistered), 0, std::nullopt});
    return false;
  }

  // Records writes and PR OUTs, whatever became of them.
  void finish(const Lu& lu, NexusId nexus, const Command& command, const Parsed& parsed,
              Accepted accepted, const SimAnswer& answer, bool landed,
              std::vector<NexusId> unregistered) {
    if (!parsed.op) {
      return;
    }
    if (is_write(*parsed.op)) {
      history_.writes.push_back(WriteRecord{next_sequence_++, clock_.now(), accepted.at, lu.id,
                                            nexus, parsed.lba, parsed.blocks, landed,
                                            outcome_of(answer), accepted.sequence});
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

void SimTarget::move_path(const std::string& device, LuId lu, NexusId nexus) {
  impl_->lu(lu).known.insert(nexus);
  impl_->paths_.insert_or_assign(device, SimPath{lu, nexus});
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

bool SimTarget::power_cycle(LuId lu) {
  return impl_->power_cycle(impl_->lu(lu));
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

std::size_t SimTarget::held_count(LuId lu, NexusId nexus) const {
  const auto& tasks = impl_->lu(lu).tasks;
  return static_cast<std::size_t>(
      std::count_if(tasks.begin(), tasks.end(),
                    [nexus](const auto& entry) { return entry.second.nexus == nexus; }));
}

bool SimTarget::aptpl_active(LuId lu) const {
  return impl_->lu(lu).aptpl_active;
}

void SimTarget::set_ptpl_capable(LuId lu, bool capable) {
  impl_->lu(lu).config.ptpl_capable = capable;
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

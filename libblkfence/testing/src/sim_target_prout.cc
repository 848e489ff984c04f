// The simulated target's PERSISTENT RESERVE OUT: each service action as its core_scsi3_* handler
// in LIO's target_core_pr.c (Linux 6.1) executes it, including where LIO departs from SPC-4;
// those places say so. Not thread-safe, like SimTarget.
#include <algorithm>

#include "blkfence/endian.h"

#include "sim_target_lu.h"

namespace blkfence::transport::sim_lu {
namespace {

// The TransportID of a REGISTER AND MOVE names a nexus by its SAS address.
std::optional<NexusId> nexus_of(const codec::TransportId& id) {
  if (id.protocol != codec::ProtocolId::kSas ||
      (id.port_name & 0xffffffff00000000ULL) != SimTarget::kInitiatorSasBase) {
    return std::nullopt;
  }
  return static_cast<NexusId>(id.port_name & 0xffffffffULL);
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
    if (in_.aptpl && !lu_.config.ptpl_capable) {
      return check_condition(kInvalidFieldInParameterList);  // SPC-4 6.16.2: APTPL not supported
    }
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

}  // namespace

PrOutResult execute_prout(Lu& lu, NexusId nexus, const Command& command) {
  const PrOut prout = read_prout(command);
  PrOutExecution execution(lu, nexus, prout);
  SimAnswer answer = execution.run();
  return {.answer = std::move(answer),
          .unregistered = execution.unregistered(),
          .abort_keys = execution.abort_keys()};
}

}  // namespace blkfence::transport::sim_lu

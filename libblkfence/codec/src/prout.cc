// PERSISTENT RESERVE OUT encoding (codec layer). Pure, thread-safe.
//
// Layouts per SPC-4 6.16 as LIO parses them (target_core_pr.c: target_scsi3_emulate_pr_out(),
// core_scsi3_emulate_pro_register_and_move()); see docs/reference/spc4-pr.md §3.
#include "blkfence/codec/prout.h"

#include <string>

#include "blkfence/assert.h"

namespace blkfence::codec {
namespace {

// Basic parameter list, byte 20.
constexpr std::uint8_t kSpecIPt = 0x08;
constexpr std::uint8_t kAllTgPt = 0x04;
constexpr std::uint8_t kAptpl = 0x01;
// REGISTER AND MOVE parameter list, byte 17.
constexpr std::uint8_t kUnreg = 0x02;
constexpr std::uint8_t kMoveAptpl = 0x01;

constexpr std::uint8_t flag(bool set, std::uint8_t bit) {
  return set ? bit : 0;
}

// The 16 bytes both parameter lists start with.
std::vector<std::uint8_t> list_starting_with(std::uint64_t key, std::uint64_t sa_key) {
  std::vector<std::uint8_t> list(kPrOutBasicListSize, 0);
  store_be64(list, 0, key);
  store_be64(list, 8, sa_key);
  return list;
}

PrOutCommand command(PrOutAction action, std::optional<PrType> type,
                     std::vector<std::uint8_t> list) {
  BLKFENCE_ASSERT(list.size() <= UINT32_MAX);
  const auto length = static_cast<std::uint32_t>(list.size());
  return {encode_prout_cdb(action, type, length), std::move(list)};
}

bool needs_type(PrOutAction action) {
  return action == PrOutAction::kReserve || action == PrOutAction::kRelease ||
         action == PrOutAction::kPreempt || action == PrOutAction::kPreemptAndAbort;
}

// The parameters of the named wrappers: two keys and, for REGISTER*, the options.
PrOutParameters keys(std::uint64_t key, std::uint64_t sa_key, RegisterOptions options = {}) {
  PrOutParameters parameters;
  parameters.key = key;
  parameters.sa_key = sa_key;
  parameters.all_tg_pt = options.all_tg_pt;
  parameters.aptpl = options.aptpl;
  return parameters;
}

// The wrappers send no TransportIDs, so encode_prout() cannot refuse them.
PrOutCommand must(Result<PrOutCommand> command) {
  BLKFENCE_ASSERT(command.has_value());
  return std::move(*command);
}

}  // namespace

Cdb10 encode_prout_cdb(PrOutAction action, std::optional<PrType> type,
                       std::uint32_t parameter_list_length) {
  Cdb10 cdb{};
  cdb[0] = static_cast<std::uint8_t>(OpCode::kPersistentReserveOut);
  cdb[1] = static_cast<std::uint8_t>(action) & 0x1fU;
  // Byte 2: SCOPE (bits 7-4) stays 0h = LU_SCOPE; TYPE in bits 3-0.
  cdb[2] = type ? static_cast<std::uint8_t>(static_cast<std::uint8_t>(*type) & 0x0fU) : 0;
  // Bytes 5-8, 32 bits as sd.c writes it (put_unaligned_be32(24, &cmd[5])).
  store_be32(cdb, 5, parameter_list_length);
  return cdb;
}

Result<PrOutCommand> encode_prout(PrOutAction action, std::optional<PrType> type,
                                  const PrOutParameters& parameters) {
  const std::string where = "PR OUT " + std::string(to_string(action));
  if (action == PrOutAction::kRegisterAndMove) {
    return fail(ErrorCode::kInvalidArgument,
                where + ": has its own parameter list (encode_prout_register_and_move)");
  }
  if (needs_type(action) && !type) {
    return fail(ErrorCode::kInvalidArgument, where + ": needs a reservation type");
  }
  // SPC-4 6.16.3; LIO answers INVALID FIELD IN PARAMETER LIST (26/00) otherwise.
  if (parameters.spec_i_pt && action != PrOutAction::kRegister) {
    return fail(ErrorCode::kInvalidArgument, where + ": SPEC_I_PT is valid only with REGISTER");
  }
  if (!parameters.spec_i_pt && !parameters.transport_ids.empty()) {
    return fail(ErrorCode::kInvalidArgument, where + ": TransportIDs need SPEC_I_PT");
  }
  std::vector<std::uint8_t> list = list_starting_with(parameters.key, parameters.sa_key);
  list[20] = flag(parameters.spec_i_pt, kSpecIPt) | flag(parameters.all_tg_pt, kAllTgPt) |
             flag(parameters.aptpl, kAptpl);
  if (parameters.spec_i_pt) {
    // Bytes 24-27: TRANSPORTID PARAMETER DATA LENGTH, then the TransportIDs.
    list.resize(kPrOutBasicListSize + 4, 0);
    for (const TransportId& id : parameters.transport_ids) {
      if (auto appended = append_transport_id(list, id); !appended) {
        return tl::unexpected(appended.error());
      }
    }
    store_be32(list, kPrOutBasicListSize,
               static_cast<std::uint32_t>(list.size() - kPrOutBasicListSize - 4));
  }
  return command(action, type, std::move(list));
}

Result<PrOutCommand> encode_prout_register_and_move(const RegisterAndMoveParameters& parameters) {
  std::vector<std::uint8_t> list = list_starting_with(parameters.key, parameters.sa_key);
  list[17] = flag(parameters.unreg, kUnreg) | flag(parameters.aptpl, kMoveAptpl);
  store_be16(list, 18, parameters.relative_target_port_id);
  auto appended = append_transport_id(list, parameters.transport_id);
  if (!appended) {
    return tl::unexpected(appended.error());
  }
  // Bytes 20-23: LIO requires exactly data length - 24 here, else 26/00.
  store_be32(list, 20, static_cast<std::uint32_t>(*appended));
  // SPC-4 5.13.8: the move keeps the reservation's scope and type; the CDB's TYPE is ignored.
  return command(PrOutAction::kRegisterAndMove, std::nullopt, std::move(list));
}

PrOutCommand prout_register(std::uint64_t key, std::uint64_t new_key, RegisterOptions options) {
  return must(encode_prout(PrOutAction::kRegister, std::nullopt, keys(key, new_key, options)));
}

PrOutCommand prout_register_and_ignore(std::uint64_t new_key, RegisterOptions options) {
  // RESERVATION KEY is ignored (LIO passes 0 on); send 0 as sg_persist does.
  return must(encode_prout(PrOutAction::kRegisterAndIgnoreExistingKey, std::nullopt,
                           keys(0, new_key, options)));
}

PrOutCommand prout_reserve(std::uint64_t key, PrType type) {
  return must(encode_prout(PrOutAction::kReserve, type, keys(key, 0)));
}

PrOutCommand prout_release(std::uint64_t key, PrType type) {
  return must(encode_prout(PrOutAction::kRelease, type, keys(key, 0)));
}

PrOutCommand prout_clear(std::uint64_t key) {
  return must(encode_prout(PrOutAction::kClear, std::nullopt, keys(key, 0)));
}

PrOutCommand prout_preempt(std::uint64_t key, std::uint64_t victim_key, PrType type) {
  return must(encode_prout(PrOutAction::kPreempt, type, keys(key, victim_key)));
}

PrOutCommand prout_preempt_and_abort(std::uint64_t key, std::uint64_t victim_key, PrType type) {
  return must(encode_prout(PrOutAction::kPreemptAndAbort, type, keys(key, victim_key)));
}

}  // namespace blkfence::codec

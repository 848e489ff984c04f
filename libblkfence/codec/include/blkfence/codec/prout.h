// PERSISTENT RESERVE OUT (5Fh): CDB and parameter list encoding (codec layer).
//
// encode_prout() is the one encoder for the basic parameter list (every service action but
// REGISTER AND MOVE, which has its own list); the prout_* functions are thin named wrappers for the
// fencing operations. A PrOutCommand owns its CDB and data-out buffer, so a transport can keep it
// alive until the command is reaped. Keys are plain 64-bit values here: the codec sits below the
// fence layer's Key. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/codec/transport_id.h"
#include "blkfence/error.h"

namespace blkfence::codec {

// SPC-4 6.16.3: the basic parameter list is exactly 24 bytes unless SPEC_I_PT appends TransportIDs.
inline constexpr std::uint32_t kPrOutBasicListSize = 24;

struct PrOutCommand {
  Cdb10 cdb{};
  std::vector<std::uint8_t> parameters;  // data-out, PARAMETER LIST LENGTH bytes

  friend bool operator==(const PrOutCommand&, const PrOutCommand&) = default;
};

// The basic parameter list (SPC-4 6.16.3).
struct PrOutParameters {
  std::uint64_t key = 0;     // RESERVATION KEY: the caller's registered key, 0 if unregistered
  std::uint64_t sa_key = 0;  // SERVICE ACTION RESERVATION KEY: new key, or the key to preempt
  bool spec_i_pt = false;    // REGISTER only: also register transport_ids
  bool all_tg_pt = false;    // REGISTER*: register through every target port
  bool aptpl = false;        // REGISTER*: persist through power loss (the last REGISTER wins)
  std::vector<TransportId> transport_ids;  // sent only with spec_i_pt

  friend bool operator==(const PrOutParameters&, const PrOutParameters&) = default;
};

// The REGISTER AND MOVE parameter list (SPC-4 6.16.4).
struct RegisterAndMoveParameters {
  std::uint64_t key = 0;     // the holder's key
  std::uint64_t sa_key = 0;  // the key to register for the destination I_T nexus
  bool unreg = false;        // unregister the source I_T nexus after the move
  bool aptpl = false;
  std::uint16_t relative_target_port_id = 0;  // the destination target port
  TransportId transport_id;                   // the destination initiator port
};

// The CDB alone: SCOPE is always LU_SCOPE (0h, the only scope LIO accepts); TYPE is 0 when absent
// (REGISTER*, CLEAR, REGISTER AND MOVE ignore it, SPC-4 6.16.2).
Cdb10 encode_prout_cdb(PrOutAction action, std::optional<PrType> type,
                       std::uint32_t parameter_list_length);

// Any service action but REGISTER AND MOVE. kInvalidArgument when the combination is one SPC-4
// rejects: no type for RESERVE, RELEASE or PREEMPT*, SPEC_I_PT on anything but REGISTER,
// TransportIDs without SPEC_I_PT; and what append_transport_id() refuses.
[[nodiscard]] Result<PrOutCommand> encode_prout(PrOutAction action, std::optional<PrType> type,
                                                const PrOutParameters& parameters);

[[nodiscard]] Result<PrOutCommand> encode_prout_register_and_move(
    const RegisterAndMoveParameters& parameters);

// Named wrappers for the operations the fencing protocol issues. They carry no TransportIDs, so
// they cannot fail.
struct RegisterOptions {
  bool all_tg_pt = false;
  bool aptpl = false;
};
// key is the nexus's current key (0 when unregistered); new_key 0 unregisters.
PrOutCommand prout_register(std::uint64_t key, std::uint64_t new_key, RegisterOptions options = {});
// Registers new_key whatever is registered now (fence_scsi's `sg_persist -o -I`); 0 unregisters.
PrOutCommand prout_register_and_ignore(std::uint64_t new_key, RegisterOptions options = {});
PrOutCommand prout_reserve(std::uint64_t key, PrType type);
PrOutCommand prout_release(std::uint64_t key, PrType type);
PrOutCommand prout_clear(std::uint64_t key);
PrOutCommand prout_preempt(std::uint64_t key, std::uint64_t victim_key, PrType type);
PrOutCommand prout_preempt_and_abort(std::uint64_t key, std::uint64_t victim_key, PrType type);

}  // namespace blkfence::codec

// PERSISTENT RESERVE IN (5Eh): CDB encoding and response decoding (codec layer).
//
// The decoders never trust a length the device reports: they decode what is really in the buffer,
// return the device's claim beside it and set `truncated` when the claim was not met (re-read with
// a larger allocation length, or treat the state as unknown). LIO keeps ADDITIONAL LENGTH
// untruncated for READ KEYS but drops and uncounts READ FULL STATUS descriptors that do not fit
// (docs/reference/lio.md §1), so `truncated == false` on READ FULL STATUS does not prove
// completeness on LIO. Only a response shorter than its fixed header is an Error (kTruncated).
// Pass the bytes actually transferred (dxfer_len - resid), not the whole buffer. Pure functions,
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "blkfence/codec/cdb.h"
#include "blkfence/codec/transport_id.h"
#include "blkfence/endian.h"
#include "blkfence/error.h"

namespace blkfence::codec {

// LIO rejects PR IN with an allocation length below 8 and writes neither key nor type for READ
// RESERVATION below 22 (docs/reference/lio.md §1): ask for at least this much.
inline constexpr std::uint16_t kPrInAllocationLengthMin = 24;

Cdb10 encode_prin_cdb(PrInAction action, std::uint16_t allocation_length);

struct ReadKeys {
  std::uint32_t generation = 0;
  std::vector<std::uint64_t> keys;      // one per registered I_T nexus, in the device's order
  std::uint32_t additional_length = 0;  // as the device wrote it: 8 per registration
  bool truncated = false;               // 8 * keys.size() < additional_length
};

struct Reservation {
  std::uint64_t key = 0;  // 0 under an all-registrants type (SPC-4 5.13.10)
  PrType type{};
  std::uint8_t scope = 0;  // SCOPE (0 = LU_SCOPE)
};

struct ReadReservation {
  std::uint32_t generation = 0;
  std::optional<Reservation> reservation;  // nullopt: none, or unknown when truncated
  std::uint32_t additional_length = 0;     // 0 (no reservation) or 16
  bool truncated = false;
};

// SPC-4 6.15.4, table "REPORT CAPABILITIES parameter data".
struct Capabilities {
  std::uint16_t length = 0;  // LENGTH as the device wrote it (8)
  bool truncated = false;
  bool rlr_c = false;   // REPLACE LOST RESERVATION capable
  bool crh = false;     // compatible reservation handling
  bool sip_c = false;   // SPEC_I_PT capable
  bool atp_c = false;   // ALL_TG_PT capable
  bool ptpl_c = false;  // persist through power loss capable
  bool tmv = false;     // type_mask is valid
  std::uint8_t allow_commands = 0;
  bool ptpl_a = false;  // APTPL is active
  // Bit n set: TYPE code n is supported (bytes 4 and 5 of the response, byte 5 as the high byte).
  std::uint16_t type_mask = 0;

  bool supports(PrType type) const {
    return tmv && ((type_mask >> static_cast<unsigned>(type)) & 1U) != 0;
  }
};

struct FullStatusDescriptor {
  std::uint64_t key = 0;
  bool all_tg_pt = false;
  bool holder = false;  // R_HOLDER (LIO also sets it for every registrant under an AR type)
  PrType type{};        // TYPE and SCOPE: meaningful only when holder
  std::uint8_t scope = 0;
  std::uint16_t relative_target_port_id = 0;  // undefined when all_tg_pt
  std::optional<TransportId> transport_id;    // nullopt: none sent, unsupported protocol, malformed
};

struct FullStatus {
  std::uint32_t generation = 0;
  std::vector<FullStatusDescriptor> descriptors;  // complete descriptors only
  std::uint32_t additional_length = 0;
  bool truncated = false;
};

[[nodiscard]] Result<ReadKeys> decode_read_keys(Bytes response);
[[nodiscard]] Result<ReadReservation> decode_read_reservation(Bytes response);
[[nodiscard]] Result<Capabilities> decode_report_capabilities(Bytes response);
[[nodiscard]] Result<FullStatus> decode_read_full_status(Bytes response);

}  // namespace blkfence::codec

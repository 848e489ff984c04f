// PERSISTENT RESERVE IN encoding and decoding (codec layer). Pure, thread-safe.
//
// Layouts per SPC-4 6.15 as LIO writes them (target_core_pr.c: core_scsi3_pri_read_keys(),
// core_scsi3_pri_read_reservation(), core_scsi3_pri_report_capabilities(),
// core_scsi3_pri_read_full_status()); see docs/reference/spc4-pr.md §5 and lio.md §1.
#include "blkfence/codec/prin.h"

#include <string>

#include "wire.h"

namespace blkfence::codec {
namespace {

constexpr std::size_t kHeaderSize = 8;        // PRGENERATION, ADDITIONAL LENGTH
constexpr std::size_t kReservationSize = 14;  // bytes 8-21: key, obsolete, reserved, scope|type
constexpr std::size_t kDescriptorSize = 24;   // full status descriptor before its TransportID
constexpr std::size_t kCapabilitiesSize = 6;  // LIO accepts 6; bytes 6-7 are reserved

// The header READ KEYS, READ RESERVATION and READ FULL STATUS share, and the body it bounds.
struct Framed {
  std::uint32_t generation;
  std::uint32_t additional_length;
  detail::Body body;
};

Result<Framed> frame(Bytes response, PrInAction action) {
  if (response.size() < kHeaderSize) {
    return fail(ErrorCode::kTruncated, std::string(to_string(action)) + " response of " +
                                           std::to_string(response.size()) +
                                           " bytes, shorter than its 8-byte header");
  }
  const std::uint32_t additional_length = load_be32(response, 4);
  return Framed{load_be32(response, 0), additional_length,
                detail::body_after(response, kHeaderSize, additional_length)};
}

constexpr PrType type_of(std::uint8_t scope_type) {
  return static_cast<PrType>(scope_type & 0x0fU);
}
constexpr std::uint8_t scope_of(std::uint8_t scope_type) {
  return static_cast<std::uint8_t>(scope_type >> 4U);
}

}  // namespace

Cdb10 encode_prin_cdb(PrInAction action, std::uint16_t allocation_length) {
  Cdb10 cdb{};
  cdb[0] = static_cast<std::uint8_t>(OpCode::kPersistentReserveIn);
  cdb[1] = static_cast<std::uint8_t>(action) & 0x1fU;
  store_be16(cdb, 7, allocation_length);
  return cdb;
}

Result<ReadKeys> decode_read_keys(Bytes response) {
  auto framed = frame(response, PrInAction::kReadKeys);
  if (!framed) {
    return tl::unexpected(framed.error());
  }
  const Bytes list = framed->body.bytes;
  ReadKeys keys{.generation = framed->generation,
                .keys = {},
                .additional_length = framed->additional_length,
                .truncated = false};
  keys.keys.reserve(list.size() / 8);
  for (std::size_t offset = 0; offset + 8 <= list.size(); offset += 8) {
    keys.keys.push_back(load_be64(list, offset));
  }
  // A trailing partial key is as missing as one cut off by the buffer.
  keys.truncated = framed->body.truncated || list.size() % 8 != 0;
  return keys;
}

Result<ReadReservation> decode_read_reservation(Bytes response) {
  auto framed = frame(response, PrInAction::kReadReservation);
  if (!framed) {
    return tl::unexpected(framed.error());
  }
  ReadReservation result{.generation = framed->generation,
                         .reservation = std::nullopt,
                         .additional_length = framed->additional_length,
                         .truncated = framed->body.truncated};
  const Bytes body = framed->body.bytes;
  if (framed->additional_length == 0) {
    return result;  // no reservation
  }
  // LIO writes ADDITIONAL LENGTH 16 but no key or type below 22 bytes (lio.md §1): unknown, not
  // none.
  if (body.size() < kReservationSize) {
    result.truncated = true;
    return result;
  }
  const std::uint8_t scope_type = body[kReservationSize - 1];
  result.reservation = Reservation{
      .key = load_be64(body, 0), .type = type_of(scope_type), .scope = scope_of(scope_type)};
  return result;
}

Result<Capabilities> decode_report_capabilities(Bytes response) {
  // LENGTH (bytes 0-1) counts the whole response, itself included.
  const std::uint16_t length = response.size() >= 2 ? load_be16(response, 0) : 0;
  const detail::Body usable = detail::body_after(response, 0, length);
  if (usable.bytes.size() < kCapabilitiesSize) {
    return fail(ErrorCode::kTruncated, "REPORT CAPABILITIES response of " +
                                           std::to_string(response.size()) + " bytes with LENGTH " +
                                           std::to_string(length) +
                                           ", shorter than its 6 bytes of flags");
  }
  const Bytes r = usable.bytes;
  return Capabilities{
      .length = length,
      .truncated = usable.truncated,
      .rlr_c = (r[2] & 0x80U) != 0,
      .crh = (r[2] & 0x10U) != 0,
      .sip_c = (r[2] & 0x08U) != 0,
      .atp_c = (r[2] & 0x04U) != 0,
      .ptpl_c = (r[2] & 0x01U) != 0,
      .tmv = (r[3] & 0x80U) != 0,
      .allow_commands = static_cast<std::uint8_t>((r[3] >> 4U) & 0x07U),
      .ptpl_a = (r[3] & 0x01U) != 0,
      // SPC-4 table "PERSISTENT RESERVATION TYPE MASK": byte 4 bit n is type n (1, 3, 5, 6, 7),
      // byte 5 bit 0 is type 8, so byte 5 is the high byte of a bit-per-type mask.
      .type_mask = static_cast<std::uint16_t>(r[4] | (r[5] << 8U)),
  };
}

Result<FullStatus> decode_read_full_status(Bytes response) {
  auto framed = frame(response, PrInAction::kReadFullStatus);
  if (!framed) {
    return tl::unexpected(framed.error());
  }
  FullStatus status{.generation = framed->generation,
                    .descriptors = {},
                    .additional_length = framed->additional_length,
                    .truncated = framed->body.truncated};
  const bool cut = detail::for_each_descriptor(
      framed->body.bytes, kDescriptorSize, [](Bytes header) { return load_be32(header, 20); },
      [&status](Bytes header, Bytes tid) {
        FullStatusDescriptor descriptor{
            .key = load_be64(header, 0),
            .all_tg_pt = (header[12] & 0x02U) != 0,
            .holder = (header[12] & 0x01U) != 0,
            .type = type_of(header[13]),
            .scope = scope_of(header[13]),
            .relative_target_port_id = load_be16(header, 18),
            .transport_id = std::nullopt,
        };
        if (auto id = decode_transport_id(tid); id) {
          descriptor.transport_id = std::move(*id);
        }
        status.descriptors.push_back(std::move(descriptor));
      });
  status.truncated = status.truncated || cut;
  return status;
}

}  // namespace blkfence::codec

// libFuzzer harness for the PR IN response decoders (codec layer): proves that for any bytes a
// device could return, decode_read_keys(), decode_read_reservation(),
// decode_report_capabilities() and decode_read_full_status() read only the buffer, fail only
// below their fixed header, decode every field from the bytes where SPC-4 6.15 puts it, keep only
// what is really there (at most (size - 8) / 8 keys, complete full status descriptors only), and
// set `truncated` exactly when prin.h says: the device's length claim was not met.
//
// One harness runs all four decoders on every input rather than dispatching on a selector byte:
// READ KEYS, READ RESERVATION and READ FULL STATUS share their 8-byte header and its framing
// (prin.cc: frame()), so an input that reaches deep into one is a useful seed for the others, and
// a crashing input is the response itself, to paste into prin_test.cc as is. The expected values
// come from a second, deliberately naive reading of the layout below, not from the codec's own
// helpers (wire.h). Single-threaded, as libFuzzer calls it.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "blkfence/assert.h"
#include "blkfence/codec/prin.h"

namespace blkfence::codec {
namespace {

constexpr std::size_t kHeaderSize = 8;
constexpr std::size_t kReservationSize = 14;  // READ RESERVATION bytes 8-21, up to SCOPE | TYPE
constexpr std::size_t kDescriptorSize = 24;   // full status descriptor before its TransportID

// SPC-4 6.15: what the header's ADDITIONAL LENGTH frames, and whether the buffer ended first.
struct Framing {
  std::size_t body_size;  // bytes after the header that the decoders may read
  bool cut;               // ADDITIONAL LENGTH claims more than the buffer holds
};

Framing framing(Bytes response) {
  const std::uint64_t claimed = load_be32(response, 4);
  const std::size_t available = response.size() - kHeaderSize;
  return claimed > available ? Framing{available, true}
                             : Framing{static_cast<std::size_t>(claimed), false};
}

void check_read_keys(Bytes response) {
  const auto keys = decode_read_keys(response);
  if (response.size() < kHeaderSize) {
    BLKFENCE_ASSERT(!keys && keys.error().code() == ErrorCode::kTruncated);
    return;
  }
  BLKFENCE_ASSERT(keys.has_value());
  BLKFENCE_ASSERT(keys->generation == load_be32(response, 0));
  BLKFENCE_ASSERT(keys->additional_length == load_be32(response, 4));
  const Framing f = framing(response);
  BLKFENCE_ASSERT(keys->keys.size() == f.body_size / 8);
  BLKFENCE_ASSERT(keys->keys.size() <= (response.size() - kHeaderSize) / 8);
  for (std::size_t i = 0; i < keys->keys.size(); ++i) {
    BLKFENCE_ASSERT(keys->keys[i] == load_be64(response, kHeaderSize + 8 * i));
  }
  // prin.cc: a partial key is as missing as one cut off by the buffer, so `truncated` means fewer
  // than ceil(ADDITIONAL LENGTH / 8) keys, i.e. 8 * keys < ADDITIONAL LENGTH.
  BLKFENCE_ASSERT(keys->truncated == (f.cut || f.body_size % 8 != 0));
  BLKFENCE_ASSERT(keys->truncated ==
                  (8 * std::uint64_t{keys->keys.size()} < keys->additional_length));
}

void check_read_reservation(Bytes response) {
  const auto result = decode_read_reservation(response);
  if (response.size() < kHeaderSize) {
    BLKFENCE_ASSERT(!result && result.error().code() == ErrorCode::kTruncated);
    return;
  }
  BLKFENCE_ASSERT(result.has_value());
  BLKFENCE_ASSERT(result->generation == load_be32(response, 0));
  BLKFENCE_ASSERT(result->additional_length == load_be32(response, 4));
  const Framing f = framing(response);
  if (result->additional_length == 0) {
    BLKFENCE_ASSERT(!result->reservation.has_value() && !result->truncated);
    return;
  }
  // A claimed reservation is never reported as none: either decoded or flagged as unknown.
  BLKFENCE_ASSERT(result->reservation.has_value() || result->truncated);
  if (f.body_size < kReservationSize) {
    BLKFENCE_ASSERT(!result->reservation.has_value() && result->truncated);
    return;
  }
  BLKFENCE_ASSERT(result->reservation.has_value());
  BLKFENCE_ASSERT(response.size() >= kHeaderSize + kReservationSize);
  BLKFENCE_ASSERT(result->truncated == f.cut);
  const std::uint8_t scope_type = response[21];
  BLKFENCE_ASSERT(result->reservation->key == load_be64(response, kHeaderSize));
  BLKFENCE_ASSERT(static_cast<unsigned>(result->reservation->type) == (scope_type & 0x0fU));
  BLKFENCE_ASSERT(result->reservation->scope == scope_type >> 4U);
}

void check_report_capabilities(Bytes response) {
  const auto caps = decode_report_capabilities(response);
  // LENGTH (bytes 0-1) counts the whole response; the flags need bytes 0-5 within it.
  const std::size_t length = response.size() >= 2 ? load_be16(response, 0) : 0;
  const std::size_t usable = length < response.size() ? length : response.size();
  if (usable < 6) {
    BLKFENCE_ASSERT(!caps && caps.error().code() == ErrorCode::kTruncated);
    return;
  }
  BLKFENCE_ASSERT(caps.has_value());
  BLKFENCE_ASSERT(caps->length == length);
  BLKFENCE_ASSERT(caps->truncated == (length > response.size()));
  BLKFENCE_ASSERT(caps->rlr_c == ((response[2] & 0x80U) != 0));
  BLKFENCE_ASSERT(caps->crh == ((response[2] & 0x10U) != 0));
  BLKFENCE_ASSERT(caps->sip_c == ((response[2] & 0x08U) != 0));
  BLKFENCE_ASSERT(caps->atp_c == ((response[2] & 0x04U) != 0));
  BLKFENCE_ASSERT(caps->ptpl_c == ((response[2] & 0x01U) != 0));
  BLKFENCE_ASSERT(caps->tmv == ((response[3] & 0x80U) != 0));
  BLKFENCE_ASSERT(caps->allow_commands == ((response[3] >> 4U) & 0x07U));
  BLKFENCE_ASSERT(caps->ptpl_a == ((response[3] & 0x01U) != 0));
  // SPC-4 table "PERSISTENT RESERVATION TYPE MASK": byte 4 bit n is TYPE n, byte 5 bit 0 TYPE 8.
  for (unsigned type = 0; type < 16; ++type) {
    const unsigned byte = type < 8 ? response[4] : response[5];
    const bool bit = ((byte >> (type % 8)) & 1U) != 0;
    BLKFENCE_ASSERT(caps->supports(static_cast<PrType>(type)) == (caps->tmv && bit));
  }
}

void check_read_full_status(Bytes response) {
  const auto status = decode_read_full_status(response);
  if (response.size() < kHeaderSize) {
    BLKFENCE_ASSERT(!status && status.error().code() == ErrorCode::kTruncated);
    return;
  }
  BLKFENCE_ASSERT(status.has_value());
  BLKFENCE_ASSERT(status->generation == load_be32(response, 0));
  BLKFENCE_ASSERT(status->additional_length == load_be32(response, 4));
  const Framing f = framing(response);
  BLKFENCE_ASSERT(status->descriptors.size() <= f.body_size / kDescriptorSize);
  // Walk the descriptors again: each is 24 bytes and an ADDITIONAL DESCRIPTOR LENGTH (bytes 20-23)
  // of TransportID, and only those wholly inside the framed body count.
  const std::size_t end = kHeaderSize + f.body_size;
  std::size_t offset = kHeaderSize;
  std::size_t index = 0;
  bool cut = false;
  while (offset < end) {
    if (end - offset < kDescriptorSize) {
      cut = true;
      break;
    }
    const std::uint64_t tid_size = load_be32(response, offset + 20);
    if (tid_size > end - offset - kDescriptorSize) {
      cut = true;
      break;
    }
    BLKFENCE_ASSERT(index < status->descriptors.size());
    const FullStatusDescriptor& d = status->descriptors[index];
    BLKFENCE_ASSERT(d.key == load_be64(response, offset));
    BLKFENCE_ASSERT(d.all_tg_pt == ((response[offset + 12] & 0x02U) != 0));
    BLKFENCE_ASSERT(d.holder == ((response[offset + 12] & 0x01U) != 0));
    BLKFENCE_ASSERT(static_cast<unsigned>(d.type) == (response[offset + 13] & 0x0fU));
    BLKFENCE_ASSERT(d.scope == response[offset + 13] >> 4U);
    BLKFENCE_ASSERT(d.relative_target_port_id == load_be16(response, offset + 18));
    // The TransportID is exactly the bytes the descriptor frames, decoded or absent.
    const Bytes tid = response.subspan(offset + kDescriptorSize, tid_size);
    const auto expected = decode_transport_id(tid);
    BLKFENCE_ASSERT(d.transport_id.has_value() == expected.has_value());
    BLKFENCE_ASSERT(!expected || *d.transport_id == *expected);
    offset += kDescriptorSize + tid_size;
    ++index;
  }
  BLKFENCE_ASSERT(index == status->descriptors.size());
  BLKFENCE_ASSERT(status->truncated == (f.cut || cut));
}

}  // namespace
}  // namespace blkfence::codec

// NOLINTNEXTLINE(readability-identifier-naming): the name libFuzzer calls.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const blkfence::Bytes response(data, size);
  blkfence::codec::check_read_keys(response);
  blkfence::codec::check_read_reservation(response);
  blkfence::codec::check_report_capabilities(response);
  blkfence::codec::check_read_full_status(response);
  return 0;
}

// libFuzzer harness for TransportIDs (codec layer): proves that decode_transport_id() takes any
// bytes a READ FULL STATUS descriptor could frame, refuses exactly what transport_id.h says it
// refuses (empty, short, reserved format codes, an iSCSI text without a name or, in format 01b,
// without ",i,0x", other protocols) with the documented error code, never trusts the iSCSI
// ADDITIONAL LENGTH beyond the bytes given, takes names only from those bytes (the name, ",i,0x"
// and the ISID put back together are the NUL-terminated text from byte 4), and that every decoded
// ID the encoder accepts survives append_transport_id() and decode_transport_id() unchanged, in
// the documented size. What the encoder refuses must be one of its documented refusals: the
// decoder reads what a device sent and lets through iSCSI names longer than 223 bytes, names with
// ",i,0x" in format 00b and ISIDs that are not 12 hex digits. Single-threaded, as libFuzzer calls
// it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "blkfence/assert.h"
#include "blkfence/codec/transport_id.h"

namespace blkfence::codec {
namespace {

constexpr std::string_view kIsidSeparator = ",i,0x";

// SPC-4 7.6.4.6: the iSCSI text runs from byte 4 for ADDITIONAL LENGTH bytes, bounded by what was
// given, and ends at its first NUL.
std::string iscsi_text(Bytes tid) {
  const std::size_t claimed = load_be16(tid, 2);
  std::string text;
  for (std::size_t i = 4; i < tid.size() && i - 4 < claimed && tid[i] != 0; ++i) {
    text += static_cast<char>(tid[i]);
  }
  return text;
}

bool is_hex(std::string_view text) {
  return text.find_first_not_of("0123456789abcdefABCDEF") == std::string_view::npos;
}

// append_transport_id()'s documented refusals of an iSCSI ID (RFC 7143 6.1: names of at most 223
// bytes, ISIDs of 12 hex digits).
bool encoder_refuses(const TransportId& id) {
  return id.iscsi_name.empty() || id.iscsi_name.size() > 223 ||
         id.iscsi_name.find('\0') != std::string::npos ||
         id.iscsi_name.find(kIsidSeparator) != std::string::npos ||
         (!id.isid.empty() && (id.isid.size() != 12 || !is_hex(id.isid)));
}

void check_decoded(Bytes tid, const TransportId& id) {
  BLKFENCE_ASSERT(id.protocol == ProtocolId::kSas || id.protocol == ProtocolId::kFibreChannel ||
                  id.protocol == ProtocolId::kIscsi);
  switch (id.protocol) {
    case ProtocolId::kSas:
    case ProtocolId::kFibreChannel: {
      // SAS address at bytes 4-11, N_Port name at bytes 8-15, format 00b; nothing else.
      BLKFENCE_ASSERT((tid[0] & 0xc0U) == 0);
      const std::size_t offset = id.protocol == ProtocolId::kSas ? 4 : 8;
      BLKFENCE_ASSERT(tid.size() >= offset + 8 && id.port_name == load_be64(tid, offset));
      BLKFENCE_ASSERT(id.iscsi_name.empty() && id.isid.empty());
      break;
    }
    case ProtocolId::kIscsi: {
      BLKFENCE_ASSERT(tid.size() >= 4 && id.port_name == 0);
      const std::string text = iscsi_text(tid);
      BLKFENCE_ASSERT(!id.iscsi_name.empty());
      BLKFENCE_ASSERT(id.iscsi_name.find('\0') == std::string::npos);
      BLKFENCE_ASSERT(id.isid.find('\0') == std::string::npos);
      if ((tid[0] & 0xc0U) == 0x00) {
        BLKFENCE_ASSERT(id.iscsi_name == text && id.isid.empty() && to_string(id) == text);
      } else {
        // Format 01b: the name ends at the first ",i,0x", the ISID is everything after it and is
        // exactly 12 hex digits, so that the ID can be sent back in a PR OUT.
        BLKFENCE_ASSERT((tid[0] & 0xc0U) == 0x40);
        BLKFENCE_ASSERT(id.iscsi_name == text.substr(0, text.find(kIsidSeparator)));
        BLKFENCE_ASSERT(id.iscsi_name + std::string(kIsidSeparator) + id.isid == text);
        BLKFENCE_ASSERT(id.isid.size() == 12 && is_hex(id.isid));
        BLKFENCE_ASSERT(to_string(id) == text);
      }
      break;
    }
    default: break;
  }

  // Round trip through the encoder PR OUT uses.
  std::vector<std::uint8_t> encoded{0xa5};  // appending must not touch what is already there
  const auto size = append_transport_id(encoded, id);
  if (id.protocol == ProtocolId::kIscsi && encoder_refuses(id)) {
    BLKFENCE_ASSERT(!size && size.error().code() == ErrorCode::kInvalidArgument);
    BLKFENCE_ASSERT(encoded.size() == 1);
    return;
  }
  BLKFENCE_ASSERT(size.has_value() && *size == encoded.size() - 1 && encoded[0] == 0xa5);
  const Bytes out = Bytes(encoded).subspan(1);
  std::vector<std::uint8_t> expected(out.size(), 0);
  if (id.protocol == ProtocolId::kIscsi) {
    // SPC-4 7.6.4.6: FORMAT CODE by ISID, ADDITIONAL LENGTH at least 20 and a multiple of 4, the
    // text, then at least one NUL.
    const std::string text = to_string(id);
    BLKFENCE_ASSERT(out.size() >= 24 && out.size() % 4 == 0 && out.size() >= 4 + text.size() + 1);
    expected[0] = id.isid.empty() ? 0x05 : 0x45;
    store_be16(expected, 2, static_cast<std::uint16_t>(out.size() - 4));
    std::copy(text.begin(), text.end(), expected.begin() + 4);
  } else {
    // 24 bytes, zero but for the protocol and the port name.
    BLKFENCE_ASSERT(out.size() == 24);
    expected[0] = static_cast<std::uint8_t>(id.protocol);
    store_be64(expected, id.protocol == ProtocolId::kSas ? 4 : 8, id.port_name);
  }
  BLKFENCE_ASSERT(std::equal(out.begin(), out.end(), expected.begin()));
  const auto back = decode_transport_id(out);
  BLKFENCE_ASSERT(back.has_value() && *back == id);
}

void check_transport_id(Bytes tid) {
  const auto id = decode_transport_id(tid);
  if (id) {
    check_decoded(tid, *id);
    return;
  }
  // The refusals transport_id.h and transport_id.cc document, and only those.
  const ErrorCode code = id.error().code();
  BLKFENCE_ASSERT(!id.error().where().empty());
  if (tid.empty()) {
    BLKFENCE_ASSERT(code == ErrorCode::kTruncated);
    return;
  }
  const unsigned format = tid[0] & 0xc0U;
  switch (static_cast<ProtocolId>(tid[0] & 0x0fU)) {
    case ProtocolId::kSas:
    case ProtocolId::kFibreChannel:
      BLKFENCE_ASSERT(format != 0 ? code == ErrorCode::kInvalidArgument
                                  : code == ErrorCode::kTruncated);
      break;
    case ProtocolId::kIscsi:
      if (format != 0x00 && format != 0x40) {
        BLKFENCE_ASSERT(code == ErrorCode::kInvalidArgument);
      } else if (tid.size() < 4) {
        BLKFENCE_ASSERT(code == ErrorCode::kTruncated);
      } else {
        const std::string text = iscsi_text(tid);
        BLKFENCE_ASSERT(code == ErrorCode::kInvalidArgument);
        const std::size_t separator = text.find(kIsidSeparator);
        const std::string isid =
            separator == std::string::npos ? "" : text.substr(separator + kIsidSeparator.size());
        BLKFENCE_ASSERT(format == 0x00 ? text.empty()
                                       : separator == std::string::npos || separator == 0 ||
                                             isid.size() != 12 || !is_hex(isid));
      }
      break;
    default: BLKFENCE_ASSERT(code == ErrorCode::kNotSupported);
  }
}

}  // namespace
}  // namespace blkfence::codec

// NOLINTNEXTLINE(readability-identifier-naming): the name libFuzzer calls.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  blkfence::codec::check_transport_id(blkfence::Bytes(data, size));
  return 0;
}

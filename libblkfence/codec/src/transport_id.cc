// TransportID encoding and decoding (codec layer). Pure, thread-safe.
//
// SPC-4 7.6.4: byte 0 is FORMAT CODE (bits 7-6) | PROTOCOL IDENTIFIER (bits 3-0). SAS puts the SAS
// address at bytes 4-11 and FC the N_Port name at bytes 8-15, both in 24 bytes; iSCSI carries a
// 16-bit ADDITIONAL LENGTH at bytes 2-3 and a NUL-terminated name (format 00b) or
// "name,i,0x<ISID>" (format 01b) from byte 4 (target_core_fabric_lib.c: sas_, fc_, iscsi_*).
#include "blkfence/codec/transport_id.h"

#include <algorithm>
#include <array>
#include <string_view>

#include "wire.h"

namespace blkfence::codec {
namespace {

constexpr std::size_t kFixedTidSize = 24;
constexpr std::string_view kIsidSeparator = ",i,0x";
constexpr std::uint8_t kFormatIscsiPort = 0x40;  // FORMAT CODE 01b: name and ISID
// RFC 7143 6.1: an iSCSI name is at most 223 bytes; an ISID is 6 bytes, 12 hex digits.
constexpr std::size_t kIscsiNameMax = 223;
constexpr std::size_t kIsidDigits = 12;

bool is_hex(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
}

}  // namespace

Result<std::size_t> append_transport_id(std::vector<std::uint8_t>& out, const TransportId& id) {
  const std::size_t start = out.size();
  switch (id.protocol) {
    case ProtocolId::kSas:
    case ProtocolId::kFibreChannel: {
      out.resize(start + kFixedTidSize, 0);
      const MutableBytes tid(out.data() + start, kFixedTidSize);
      tid[0] = static_cast<std::uint8_t>(id.protocol);
      store_be64(tid, id.protocol == ProtocolId::kSas ? 4 : 8, id.port_name);
      return kFixedTidSize;
    }
    case ProtocolId::kIscsi: {
      const std::string& name = id.iscsi_name;
      if (name.empty() || name.size() > kIscsiNameMax || name.find('\0') != std::string::npos ||
          name.find(kIsidSeparator) != std::string::npos) {
        return fail(ErrorCode::kInvalidArgument,
                    "iSCSI TransportID: name '" + name + "' is empty, too long or malformed");
      }
      if (!id.isid.empty() && (id.isid.size() != kIsidDigits || !is_hex(id.isid))) {
        return fail(ErrorCode::kInvalidArgument,
                    "iSCSI TransportID: ISID '" + id.isid + "' is not 12 hex digits");
      }
      std::string text = name;
      if (!id.isid.empty()) {
        text += kIsidSeparator;
        text += id.isid;
      }
      // SPC-4 7.6.4.6: NUL-terminated, NUL-padded; ADDITIONAL LENGTH at least 20, a multiple of 4.
      const std::size_t additional_length =
          std::max<std::size_t>(20, (text.size() + 1 + 3) & ~std::size_t{3});
      out.resize(start + 4 + additional_length, 0);
      const MutableBytes tid(out.data() + start, 4 + additional_length);
      tid[0] = static_cast<std::uint8_t>(static_cast<std::uint8_t>(ProtocolId::kIscsi) |
                                         (id.isid.empty() ? 0 : kFormatIscsiPort));
      store_be16(tid, 2, static_cast<std::uint16_t>(additional_length));
      std::copy(text.begin(), text.end(), tid.begin() + 4);
      return 4 + additional_length;
    }
    default: break;
  }
  return fail(ErrorCode::kNotSupported, "TransportID for protocol identifier " +
                                            std::to_string(static_cast<unsigned>(id.protocol)));
}

Result<TransportId> decode_transport_id(Bytes tid) {
  if (tid.empty()) {
    return fail(ErrorCode::kTruncated, "TransportID: empty");
  }
  const auto protocol = static_cast<ProtocolId>(tid[0] & 0x0fU);
  const unsigned format = tid[0] & 0xc0U;
  switch (protocol) {
    case ProtocolId::kSas:
    case ProtocolId::kFibreChannel: {
      // Decode only what is there: the name ends at byte 12 (SAS) or 16 (FC) of the 24.
      const std::size_t offset = protocol == ProtocolId::kSas ? 4 : 8;
      if (format != 0) {
        return fail(ErrorCode::kInvalidArgument, "SAS/FC TransportID: format code not 00b");
      }
      if (tid.size() < offset + 8) {
        return fail(ErrorCode::kTruncated,
                    "SAS/FC TransportID of " + std::to_string(tid.size()) + " bytes");
      }
      return TransportId{
          .protocol = protocol, .port_name = load_be64(tid, offset), .iscsi_name = {}, .isid = {}};
    }
    case ProtocolId::kIscsi: {
      if (format != 0 && format != kFormatIscsiPort) {
        return fail(ErrorCode::kInvalidArgument, "iSCSI TransportID: format code not 00b or 01b");
      }
      if (tid.size() < 4) {
        return fail(ErrorCode::kTruncated,
                    "iSCSI TransportID of " + std::to_string(tid.size()) + " bytes");
      }
      // SPC-4 7.6.4.6: the first NUL ends the text whatever ADDITIONAL LENGTH says.
      const std::string text =
          detail::text_until_nul(detail::body_after(tid, 4, load_be16(tid, 2)).bytes);
      TransportId id{.protocol = protocol, .port_name = 0, .iscsi_name = text, .isid = {}};
      if (format == kFormatIscsiPort) {
        const std::size_t separator = text.find(kIsidSeparator);
        if (separator == std::string::npos) {
          return fail(ErrorCode::kInvalidArgument,
                      "iSCSI TransportID: no ',i,0x' in '" + text + "'");
        }
        id.iscsi_name = text.substr(0, separator);
        id.isid = text.substr(separator + kIsidSeparator.size());
        // The same rule the encoder applies, so that a decoded TransportID can be sent back.
        if (id.isid.size() != kIsidDigits || !is_hex(id.isid)) {
          return fail(ErrorCode::kInvalidArgument,
                      "iSCSI TransportID: ISID '" + id.isid + "' is not 12 hex digits");
        }
      }
      if (id.iscsi_name.empty()) {
        return fail(ErrorCode::kInvalidArgument, "iSCSI TransportID: empty name");
      }
      return id;
    }
    default: break;
  }
  return fail(ErrorCode::kNotSupported, "TransportID for protocol identifier " +
                                            std::to_string(static_cast<unsigned>(protocol)));
}

std::string to_string(const TransportId& id) {
  switch (id.protocol) {
    case ProtocolId::kSas:
    case ProtocolId::kFibreChannel: {
      std::array<std::uint8_t, 8> name{};
      store_be64(name, 0, id.port_name);
      std::string text = id.protocol == ProtocolId::kSas ? "sas:0x" : "fc:0x";
      detail::append_hex(text, name);
      return text;
    }
    case ProtocolId::kIscsi:
      return id.isid.empty() ? id.iscsi_name
                             : id.iscsi_name + std::string(kIsidSeparator) + id.isid;
    default: break;
  }
  return "protocol " + std::to_string(static_cast<unsigned>(id.protocol));
}

}  // namespace blkfence::codec

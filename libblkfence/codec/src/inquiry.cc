// INQUIRY encoding and VPD 0x80/0x83 decoding (codec layer). Pure, thread-safe.
//
// SPC-4 6.6.1: INQUIRY CDB with EVPD in byte 1 bit 0, PAGE CODE in byte 2, a 16-bit ALLOCATION
// LENGTH in bytes 3-4. SPC-4 7.8: every VPD page starts with a 4-byte header whose PAGE LENGTH
// (bytes 2-3) counts what follows. Designators as LIO builds them: target_core_spc.c:
// spc_emulate_evpd_80(), spc_emulate_evpd_83(), spc_gen_naa_6h_vendor_specific().
#include "blkfence/codec/inquiry.h"

#include <string_view>

#include "wire.h"

namespace blkfence::codec {
namespace {

constexpr std::size_t kVpdHeaderSize = 4;
constexpr std::size_t kDesignatorHeaderSize = 4;

Cdb6 inquiry_cdb(bool evpd, std::uint8_t page, std::uint16_t allocation_length) {
  Cdb6 cdb{};
  cdb[0] = static_cast<std::uint8_t>(OpCode::kInquiry);
  cdb[1] = evpd ? 0x01 : 0x00;
  cdb[2] = page;
  store_be16(cdb, 3, allocation_length);
  return cdb;
}

std::string hex_byte(std::uint8_t value) {
  std::string text = "0x";
  detail::append_hex(text, Bytes(&value, 1));
  return text;
}

struct VpdBody {
  std::uint16_t page_length;
  detail::Body body;
};

Result<VpdBody> vpd_body(Bytes response, VpdPage page) {
  const std::string where = "VPD page " + hex_byte(static_cast<std::uint8_t>(page));
  if (response.size() < kVpdHeaderSize) {
    return fail(ErrorCode::kTruncated, where + ": response of " + std::to_string(response.size()) +
                                           " bytes, shorter than its 4-byte header");
  }
  if (response[1] != static_cast<std::uint8_t>(page)) {
    return fail(ErrorCode::kNotSupported,
                where + ": the device answered page " + hex_byte(response[1]));
  }
  const std::uint16_t page_length = load_be16(response, 2);
  return VpdBody{page_length, detail::body_after(response, kVpdHeaderSize, page_length)};
}

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(' ');
  if (first == std::string_view::npos) {
    return {};
  }
  return std::string(text.substr(first, text.find_last_not_of(' ') - first + 1));
}

// Lower is preferred by lu_wwn(); kUnranked never qualifies.
constexpr int kUnranked = 3;
int wwn_rank(DesignatorType type) {
  switch (type) {
    case DesignatorType::kNaa: return 0;
    case DesignatorType::kEui64: return 1;
    case DesignatorType::kScsiNameString: return 2;
    default: return kUnranked;
  }
}

}  // namespace

Cdb6 encode_inquiry_cdb(std::uint16_t allocation_length) {
  return inquiry_cdb(false, 0, allocation_length);
}

Cdb6 encode_inquiry_vpd_cdb(VpdPage page, std::uint16_t allocation_length) {
  return inquiry_cdb(true, static_cast<std::uint8_t>(page), allocation_length);
}

Result<UnitSerial> decode_vpd_unit_serial(Bytes response) {
  auto vpd = vpd_body(response, VpdPage::kUnitSerialNumber);
  if (!vpd) {
    return tl::unexpected(vpd.error());
  }
  // LIO NUL-terminates the serial (spc_emulate_evpd_80); SPC-4 pads with spaces.
  return UnitSerial{.serial = trim(detail::text_until_nul(vpd->body.bytes)),
                    .page_length = vpd->page_length,
                    .truncated = vpd->body.truncated};
}

Result<DeviceIdentification> decode_vpd_device_identification(Bytes response) {
  auto vpd = vpd_body(response, VpdPage::kDeviceIdentification);
  if (!vpd) {
    return tl::unexpected(vpd.error());
  }
  DeviceIdentification identification{
      .designators = {}, .page_length = vpd->page_length, .truncated = vpd->body.truncated};
  const bool cut = detail::for_each_descriptor(
      vpd->body.bytes, kDesignatorHeaderSize, [](Bytes header) { return header[3]; },
      [&identification](Bytes header, Bytes value) {
        identification.designators.push_back(Designator{
            .protocol = static_cast<ProtocolId>(header[0] >> 4U),
            .piv = (header[1] & 0x80U) != 0,
            .code_set = static_cast<CodeSet>(header[0] & 0x0fU),
            .association = static_cast<Association>((header[1] >> 4U) & 0x03U),
            .type = static_cast<DesignatorType>(header[1] & 0x0fU),
            .value = {value.begin(), value.end()},
        });
      });
  identification.truncated = identification.truncated || cut;
  return identification;
}

std::optional<std::string> designator_string(const Designator& designator) {
  const Bytes value = designator.value;
  if (value.empty()) {
    return std::nullopt;
  }
  std::string text;
  switch (designator.type) {
    case DesignatorType::kNaa:
    case DesignatorType::kEui64:
      if (designator.code_set != CodeSet::kBinary) {
        return std::nullopt;
      }
      text = designator.type == DesignatorType::kNaa ? "naa." : "eui.";
      detail::append_hex(text, value);
      return text;
    case DesignatorType::kT10VendorId:
      if (designator.code_set != CodeSet::kAscii) {
        return std::nullopt;
      }
      return "t10." + detail::text_until_nul(value);
    case DesignatorType::kScsiNameString:
      // SPC-4 7.8.6.11: UTF-8, NUL-terminated and NUL-padded to a multiple of 4.
      if (designator.code_set != CodeSet::kUtf8) {
        return std::nullopt;
      }
      text = detail::text_until_nul(value);
      if (text.empty()) {
        return std::nullopt;
      }
      return text;
    default: return std::nullopt;
  }
}

std::optional<std::string> lu_wwn(const DeviceIdentification& identification) {
  std::optional<std::string> best;
  int best_rank = kUnranked;
  for (const Designator& designator : identification.designators) {
    const int rank = wwn_rank(designator.type);
    if (designator.association != Association::kLogicalUnit || rank >= best_rank) {
      continue;
    }
    if (auto text = designator_string(designator)) {
      best = std::move(text);
      best_rank = rank;
    }
  }
  return best;
}

}  // namespace blkfence::codec

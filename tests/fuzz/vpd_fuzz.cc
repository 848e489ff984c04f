// libFuzzer harness for the VPD decoders (codec layer): proves that for any bytes a device could
// return to INQUIRY, decode_vpd_unit_serial() and decode_vpd_device_identification() fail only
// below the 4-byte header or for another page (and then both agree which), never trust PAGE
// LENGTH or DESIGNATOR LENGTH beyond the buffer, keep only complete designators with their header
// bits and value bytes as sent, set `truncated` exactly when a length claim was not met, and that
// every string they produce is made of the buffer's bytes: the serial is a NUL-free, trimmed run
// of the page; a designator_string() is a "naa."/"eui." hex rendering of the value or a NUL-free
// prefix of it; and lu_wwn() is the first qualifying LU designator by the documented preference
// (NAA, then EUI-64, then SCSI name string).
//
// Both decoders run on every input rather than dispatching on a selector byte: byte 1 (PAGE CODE)
// already selects, and a crashing input is the page itself, to paste into inquiry_test.cc as is.
// The expected values come from a second, deliberately naive reading of SPC-4 7.8, not from the
// codec's own helpers (wire.h). Single-threaded, as libFuzzer calls it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "blkfence/assert.h"
#include "blkfence/codec/inquiry.h"

namespace blkfence::codec {
namespace {

constexpr std::size_t kVpdHeaderSize = 4;
constexpr std::size_t kDesignatorHeaderSize = 4;

// SPC-4 7.8: PAGE LENGTH (bytes 2-3) counts what follows the header.
struct Framing {
  std::size_t body_size;  // bytes after the header that the decoders may read
  bool cut;               // PAGE LENGTH claims more than the buffer holds
};

Framing framing(Bytes page) {
  const std::size_t claimed = load_be16(page, 2);
  const std::size_t available = page.size() - kVpdHeaderSize;
  return claimed > available ? Framing{available, true} : Framing{claimed, false};
}

bool is_prefix_of(std::string_view text, Bytes bytes) {
  if (text.size() > bytes.size()) {
    return false;
  }
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (static_cast<std::uint8_t>(text[i]) != bytes[i]) {
      return false;
    }
  }
  return true;
}

// Lower-case hex of bytes, as /sys/block/*/device/wwid shows a binary designator.
std::string hex_of(Bytes bytes) {
  static constexpr std::string_view kDigits = "0123456789abcdef";
  std::string text;
  for (const std::uint8_t byte : bytes) {
    text += kDigits[byte >> 4U];
    text += kDigits[byte & 0x0fU];
  }
  return text;
}

void check_unit_serial(Bytes page) {
  const auto serial = decode_vpd_unit_serial(page);
  if (page.size() < kVpdHeaderSize) {
    BLKFENCE_ASSERT(!serial && serial.error().code() == ErrorCode::kTruncated);
    return;
  }
  if (page[1] != static_cast<std::uint8_t>(VpdPage::kUnitSerialNumber)) {
    BLKFENCE_ASSERT(!serial && serial.error().code() == ErrorCode::kNotSupported);
    return;
  }
  BLKFENCE_ASSERT(serial.has_value());
  const Framing f = framing(page);
  BLKFENCE_ASSERT(serial->page_length == load_be16(page, 2));
  BLKFENCE_ASSERT(serial->truncated == f.cut);
  // The serial is the text before the first NUL, without surrounding spaces.
  const Bytes body = page.subspan(kVpdHeaderSize, f.body_size);
  std::size_t text_end = 0;
  while (text_end < body.size() && body[text_end] != 0) {
    ++text_end;
  }
  const std::string& s = serial->serial;
  BLKFENCE_ASSERT(s.size() <= text_end);
  BLKFENCE_ASSERT(s.find('\0') == std::string::npos);
  BLKFENCE_ASSERT(s.empty() || (s.front() != ' ' && s.back() != ' '));
  std::size_t first = 0;
  while (first < text_end && body[first] == ' ') {
    ++first;
  }
  std::size_t last = text_end;
  while (last > first && body[last - 1] == ' ') {
    --last;
  }
  BLKFENCE_ASSERT(s.size() == last - first && is_prefix_of(s, body.subspan(first)));
}

void check_designator_string(const Designator& d) {
  const auto text = designator_string(d);
  if (!text) {
    return;
  }
  const Bytes value = d.value;
  BLKFENCE_ASSERT(!value.empty());
  BLKFENCE_ASSERT(text->find('\0') == std::string::npos);
  BLKFENCE_ASSERT(d.type == DesignatorType::kNaa || d.type == DesignatorType::kEui64 ||
                  d.type == DesignatorType::kT10VendorId ||
                  d.type == DesignatorType::kScsiNameString);
  switch (d.type) {
    case DesignatorType::kNaa:
      BLKFENCE_ASSERT(d.code_set == CodeSet::kBinary && *text == "naa." + hex_of(value));
      break;
    case DesignatorType::kEui64:
      BLKFENCE_ASSERT(d.code_set == CodeSet::kBinary && *text == "eui." + hex_of(value));
      break;
    case DesignatorType::kT10VendorId:
      BLKFENCE_ASSERT(d.code_set == CodeSet::kAscii && text->starts_with("t10."));
      BLKFENCE_ASSERT(is_prefix_of(std::string_view(*text).substr(4), value));
      break;
    case DesignatorType::kScsiNameString:
      BLKFENCE_ASSERT(d.code_set == CodeSet::kUtf8 && !text->empty());
      BLKFENCE_ASSERT(is_prefix_of(*text, value));
      break;
    default: break;
  }
}

// inquiry.h: among designators associated with the LU, the first NAA, else the first EUI-64, else
// the first SCSI name string; a designator whose code set does not fit its type does not count.
std::optional<std::string> expected_wwn(const DeviceIdentification& identification) {
  for (const DesignatorType type :
       {DesignatorType::kNaa, DesignatorType::kEui64, DesignatorType::kScsiNameString}) {
    for (const Designator& d : identification.designators) {
      if (d.association != Association::kLogicalUnit || d.type != type) {
        continue;
      }
      if (auto text = designator_string(d)) {
        return text;
      }
    }
  }
  return std::nullopt;
}

void check_device_identification(Bytes page) {
  const auto id = decode_vpd_device_identification(page);
  if (page.size() < kVpdHeaderSize) {
    BLKFENCE_ASSERT(!id && id.error().code() == ErrorCode::kTruncated);
    return;
  }
  if (page[1] != static_cast<std::uint8_t>(VpdPage::kDeviceIdentification)) {
    BLKFENCE_ASSERT(!id && id.error().code() == ErrorCode::kNotSupported);
    return;
  }
  BLKFENCE_ASSERT(id.has_value());
  const Framing f = framing(page);
  BLKFENCE_ASSERT(id->page_length == load_be16(page, 2));
  BLKFENCE_ASSERT(id->designators.size() <= f.body_size / kDesignatorHeaderSize);
  // SPC-4 7.8.6.1: each designation descriptor is a 4-byte header and DESIGNATOR LENGTH (byte 3)
  // bytes of value; only those wholly inside the page count.
  const std::size_t end = kVpdHeaderSize + f.body_size;
  std::size_t offset = kVpdHeaderSize;
  std::size_t index = 0;
  bool cut = false;
  while (offset < end) {
    if (end - offset < kDesignatorHeaderSize || page[offset + 3] > end - offset - 4) {
      cut = true;
      break;
    }
    BLKFENCE_ASSERT(index < id->designators.size());
    const Designator& d = id->designators[index];
    const std::uint8_t byte0 = page[offset];
    const std::uint8_t byte1 = page[offset + 1];
    BLKFENCE_ASSERT(static_cast<unsigned>(d.protocol) == byte0 >> 4U);
    BLKFENCE_ASSERT(static_cast<unsigned>(d.code_set) == (byte0 & 0x0fU));
    BLKFENCE_ASSERT(d.piv == ((byte1 & 0x80U) != 0));
    BLKFENCE_ASSERT(static_cast<unsigned>(d.association) == ((byte1 >> 4U) & 0x03U));
    BLKFENCE_ASSERT(static_cast<unsigned>(d.type) == (byte1 & 0x0fU));
    const Bytes value = page.subspan(offset + kDesignatorHeaderSize, page[offset + 3]);
    BLKFENCE_ASSERT(d.value.size() == value.size() &&
                    std::equal(value.begin(), value.end(), d.value.begin()));
    check_designator_string(d);
    offset += kDesignatorHeaderSize + value.size();
    ++index;
  }
  BLKFENCE_ASSERT(index == id->designators.size());
  BLKFENCE_ASSERT(id->truncated == (f.cut || cut));

  const auto wwn = lu_wwn(*id);
  BLKFENCE_ASSERT(wwn == expected_wwn(*id));
}

}  // namespace
}  // namespace blkfence::codec

// NOLINTNEXTLINE(readability-identifier-naming): the name libFuzzer calls.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const blkfence::Bytes page(data, size);
  blkfence::codec::check_unit_serial(page);
  blkfence::codec::check_device_identification(page);
  return 0;
}

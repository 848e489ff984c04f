// libFuzzer harness for sense data (codec layer): proves that decode_sense() takes any bytes the
// kernel could hand back (sb_len_wr of them) without an error or a read past them, decodes each
// field from where SPC-4 4.5 puts it as far as ADDITIONAL SENSE LENGTH and the buffer both go,
// sets `truncated` exactly when one of them ended first, takes INFORMATION only from a field the
// device marked valid, and leaves everything but the response code unset for non-sense data.
// It then re-encodes each complete result in both formats (fixed 70h/71h and descriptor 72h/73h)
// and proves they normalise back to the same Sense and classify() alike, and that classify()
// gives the retry categories of sense.h for every sense key, including values no decoder yields.
//
// The expected fields come from a second, deliberately naive reading of the layouts below, not
// from the codec's own helpers (wire.h). Single-threaded, as libFuzzer calls it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "blkfence/assert.h"
#include "blkfence/codec/sense.h"

namespace blkfence::codec {
namespace {

constexpr std::size_t kHeaderSize = 8;  // up to and including ADDITIONAL SENSE LENGTH

// SPC-4 4.5.3: byte 0 VALID | RESPONSE CODE, byte 2 SENSE KEY, bytes 3-6 INFORMATION, byte 7
// ADDITIONAL SENSE LENGTH, bytes 12-13 ASC/ASCQ.
Sense expected_fixed(Bytes s) {
  Sense e{.format = SenseFormat::kFixed,
          .response_code = static_cast<std::uint8_t>(s[0] & 0x7fU),
          .deferred = (s[0] & 0x7fU) == 0x71};
  if (s.size() < 3) {
    e.truncated = true;
    return e;
  }
  e.sense_key = static_cast<SenseKey>(s[2] & 0x0fU);
  std::size_t usable = s.size();
  if (s.size() >= kHeaderSize) {
    usable = kHeaderSize + std::min<std::size_t>(s[7], s.size() - kHeaderSize);
  }
  e.truncated = s.size() < kHeaderSize || s[7] > s.size() - kHeaderSize || usable < 14;
  if ((s[0] & 0x80U) != 0 && usable >= 7) {
    e.information = load_be32(s, 3);
  }
  e.asc = usable > 12 ? s[12] : 0;
  e.ascq = usable > 13 ? s[13] : 0;
  return e;
}

// SPC-4 4.5.2: byte 1 SENSE KEY, bytes 2-3 ASC/ASCQ, byte 7 ADDITIONAL SENSE LENGTH, then
// descriptors of (type, additional length); type 00h with VALID set carries an 8-byte INFORMATION.
// information_seen collects every INFORMATION the descriptors offer: SPC-4 expects one at most, so
// which of several the decoder keeps is not its contract.
Sense expected_descriptor(Bytes s, std::vector<std::uint64_t>& information_seen) {
  Sense e{.format = SenseFormat::kDescriptor,
          .response_code = static_cast<std::uint8_t>(s[0] & 0x7fU),
          .deferred = (s[0] & 0x7fU) == 0x73};
  if (s.size() < 2) {
    e.truncated = true;
    return e;
  }
  e.sense_key = static_cast<SenseKey>(s[1] & 0x0fU);
  e.asc = s.size() > 2 ? s[2] : 0;
  e.ascq = s.size() > 3 ? s[3] : 0;
  if (s.size() < kHeaderSize) {
    e.truncated = true;
    return e;
  }
  e.truncated = s[7] > s.size() - kHeaderSize;
  const std::size_t end = kHeaderSize + std::min<std::size_t>(s[7], s.size() - kHeaderSize);
  std::size_t offset = kHeaderSize;
  while (offset < end) {
    if (end - offset < 2 || s[offset + 1] > end - offset - 2) {
      e.truncated = true;
      break;
    }
    const std::size_t length = s[offset + 1];
    if (s[offset] == 0x00 && length >= 10 && (s[offset + 2] & 0x80U) != 0) {
      information_seen.push_back(load_be64(s, offset + 4));
    }
    offset += 2 + length;
  }
  return e;
}

// The fields that must not depend on the format.
Sense normalised(Sense sense) {
  sense.format = SenseFormat::kUnknown;
  sense.response_code = 0;
  return sense;
}

// What sense.h promises for each category.
SenseCategory expected_category(const Sense& sense) {
  if (sense.format == SenseFormat::kUnknown) {
    return SenseCategory::kOther;
  }
  switch (sense.sense_key) {
    case SenseKey::kNoSense: return SenseCategory::kNoSense;
    case SenseKey::kRecoveredError: return SenseCategory::kRecovered;
    case SenseKey::kUnitAttention: return SenseCategory::kUnitAttention;
    case SenseKey::kNotReady:
      if (sense.asc != 0x04) {
        return SenseCategory::kNotReady;
      }
      return sense.ascq == 0x01   ? SenseCategory::kNotReadyBecomingReady
             : sense.ascq == 0x07 ? SenseCategory::kNotReadyInProgress
             : sense.ascq == 0x0a ? SenseCategory::kNotReadyTransitioning
                                  : SenseCategory::kNotReady;
    case SenseKey::kMediumError:
    case SenseKey::kHardwareError: return SenseCategory::kMediumOrHardware;
    case SenseKey::kIllegalRequest: return SenseCategory::kIllegalRequest;
    case SenseKey::kDataProtect: return SenseCategory::kDataProtect;
    case SenseKey::kAbortedCommand: return SenseCategory::kAbortedCommand;
    default: return SenseCategory::kOther;
  }
}

// Complete fixed sense data for sense: ADDITIONAL SENSE LENGTH 10, up to ASC/ASCQ and FRU.
std::vector<std::uint8_t> encode_fixed(const Sense& sense) {
  std::vector<std::uint8_t> bytes(18, 0);
  bytes[0] = static_cast<std::uint8_t>((sense.deferred ? 0x71U : 0x70U) |
                                       (sense.information ? 0x80U : 0x00U));  // VALID
  bytes[2] = static_cast<std::uint8_t>(sense.sense_key);
  bytes[7] = 10;
  if (sense.information) {
    store_be32(bytes, 3, static_cast<std::uint32_t>(*sense.information));
  }
  bytes[12] = sense.asc;
  bytes[13] = sense.ascq;
  return bytes;
}

// Complete descriptor sense data for sense, with an information descriptor when it has one.
std::vector<std::uint8_t> encode_descriptor(const Sense& sense) {
  std::vector<std::uint8_t> bytes(kHeaderSize, 0);
  bytes[0] = sense.deferred ? 0x73 : 0x72;
  bytes[1] = static_cast<std::uint8_t>(sense.sense_key);
  bytes[2] = sense.asc;
  bytes[3] = sense.ascq;
  if (sense.information) {
    bytes[7] = 12;
    bytes.insert(bytes.end(), {0x00, 0x0a, 0x80, 0x00});  // type 00h, length 0Ah, VALID
    bytes.resize(bytes.size() + 8);
    store_be64(bytes, 12, *sense.information);
  }
  return bytes;
}

void check_sense(Bytes s) {
  const Sense sense = decode_sense(s);
  if (s.empty()) {
    BLKFENCE_ASSERT(sense == Sense{.truncated = true});
    BLKFENCE_ASSERT(classify(sense) == SenseCategory::kOther);
    return;
  }
  std::vector<std::uint64_t> information_seen;
  Sense expected;
  switch (s[0] & 0x7fU) {
    case 0x70:
    case 0x71: expected = expected_fixed(s); break;
    case 0x72:
    case 0x73: expected = expected_descriptor(s, information_seen); break;
    default:
      // Not sense data (or vendor specific 7Fh): nothing but the response code is decoded.
      expected.response_code = static_cast<std::uint8_t>(s[0] & 0x7fU);
      break;
  }
  if (expected.format == SenseFormat::kDescriptor) {
    BLKFENCE_ASSERT(sense.information.has_value() == !information_seen.empty());
    BLKFENCE_ASSERT(!sense.information ||
                    std::find(information_seen.begin(), information_seen.end(),
                              *sense.information) != information_seen.end());
    expected.information = sense.information;
  }
  BLKFENCE_ASSERT(sense == expected);
  BLKFENCE_ASSERT(static_cast<unsigned>(sense.sense_key) <= 0x0f);
  if (sense.format != SenseFormat::kUnknown && s.size() < kHeaderSize) {
    BLKFENCE_ASSERT(sense.truncated);
  }
  const SenseCategory category = classify(sense);
  BLKFENCE_ASSERT(category == expected_category(sense));
  BLKFENCE_ASSERT(to_string(sense.sense_key) != "unknown sense key");

  // Normalisation: complete sense in either format decodes to these same fields. Fixed format has
  // only 4 bytes of INFORMATION.
  if (sense.format != SenseFormat::kUnknown && !sense.truncated) {
    const Sense descriptor = decode_sense(encode_descriptor(sense));
    BLKFENCE_ASSERT(descriptor.format == SenseFormat::kDescriptor && !descriptor.truncated);
    BLKFENCE_ASSERT(normalised(descriptor) == normalised(sense));
    BLKFENCE_ASSERT(classify(descriptor) == category);
    if (!sense.information || *sense.information <= 0xffffffffU) {
      const Sense fixed = decode_sense(encode_fixed(sense));
      BLKFENCE_ASSERT(fixed.format == SenseFormat::kFixed && !fixed.truncated);
      BLKFENCE_ASSERT(normalised(fixed) == normalised(sense));
      BLKFENCE_ASSERT(classify(fixed) == category);
    }
  }

  // classify() and the names are total: any sense key value, any status byte.
  Sense any = sense;
  any.format = SenseFormat::kFixed;
  any.sense_key = static_cast<SenseKey>(s[0]);
  BLKFENCE_ASSERT(classify(any) == expected_category(any));
  BLKFENCE_ASSERT(!to_string(any.sense_key).empty());
  BLKFENCE_ASSERT(!to_string(static_cast<SamStatus>(s[0])).empty());
}

}  // namespace
}  // namespace blkfence::codec

// NOLINTNEXTLINE(readability-identifier-naming): the name libFuzzer calls.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  blkfence::codec::check_sense(blkfence::Bytes(data, size));
  return 0;
}

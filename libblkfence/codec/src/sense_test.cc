// Proves that fixed and descriptor sense data normalise to the same Sense, that INFORMATION is
// taken only when the device marks it valid, that ADDITIONAL SENSE LENGTH is tried at 0, 1, its
// real value and 255 (more than the buffer) without reading past the buffer, that short or garbage
// sense decodes as far as it goes and says so, and that classify() gives the retry categories of
// docs/reference/spc4-pr.md §8.
//
// Cross-checked offline against sg3_utils 1.46: `sg_decode_sense <hex bytes>` decodes every golden
// below to the same format, current/deferred, sense key and ASC/ASCQ, and the same INFORMATION
// ("Info fld=", "Descriptor type: Information"). Like decode_sense() it ignores ASC/ASCQ beyond
// ADDITIONAL SENSE LENGTH (no "Additional sense" line for 29/07 with length 0), reads ASC from the
// 3-byte "72 06 2a", and does not take 00h or 74h as sense data ("Probably uninitialized data").
// Deliberate differences: an information descriptor with VALID=0 is printed by sg_decode_sense as
// "vendor specific" and left empty here; one whose own length (FFh) runs past the list is still
// printed by sg_decode_sense, while decode_sense() does not read it and flags the sense.
#include "blkfence/codec/sense.h"

#include <gtest/gtest.h>

#include "blkfence/testing/test_bytes.h"

namespace blkfence::codec {
namespace {

using test::hex;

// The normalised fields only: what must not depend on the format.
Sense normalised(Sense sense) {
  sense.format = SenseFormat::kUnknown;
  sense.response_code = 0;
  return sense;
}

struct Pair {
  const char* name;
  const char* fixed;
  const char* descriptor;
};

// sg_decode_sense: "Sense key: Unit Attention / Registrations preempted", "Not Ready / Logical unit
// not ready, operation in progress" (deferred), "Medium Error / Unrecovered read error, Info
// fld=0x12345678", "Not Ready / Logical unit communication failure" (what LIO's PR code returns).
constexpr Pair kPairs[] = {
    {"UA 2A/05", "70 00 06 00 00 00 00 0a 00 00 00 00 2a 05 00 00 00 00",
     "72 06 2a 05 00 00 00 00"},
    {"deferred 04/07", "71 00 02 00 00 00 00 0a 00 00 00 00 04 07 00 00 00 00",
     "73 02 04 07 00 00 00 00"},
    {"medium error with information", "f0 00 03 12 34 56 78 0a 00 00 00 00 11 00 00 00 00 00",
     "72 03 11 00 00 00 00 0c 00 0a 80 00 00 00 00 00 12 34 56 78"},
    {"LIO 08/00", "70 00 02 00 00 00 00 0a 00 00 00 00 08 00 00 00 00 00",
     "72 02 08 00 00 00 00 00"},
};

TEST(Sense, FixedAndDescriptorNormaliseAlike) {
  for (const Pair& pair : kPairs) {
    const Sense fixed = decode_sense(hex(pair.fixed));
    const Sense descriptor = decode_sense(hex(pair.descriptor));
    EXPECT_EQ(fixed.format, SenseFormat::kFixed) << pair.name;
    EXPECT_EQ(descriptor.format, SenseFormat::kDescriptor) << pair.name;
    EXPECT_FALSE(fixed.truncated) << pair.name;
    EXPECT_EQ(normalised(fixed), normalised(descriptor)) << pair.name;
    EXPECT_EQ(classify(fixed), classify(descriptor)) << pair.name;
  }
}

TEST(Sense, DecodesGoldenFields) {
  const Sense ua = decode_sense(hex(kPairs[0].fixed));
  EXPECT_EQ(ua.response_code, 0x70);
  EXPECT_FALSE(ua.deferred);
  EXPECT_EQ(ua.sense_key, SenseKey::kUnitAttention);
  EXPECT_EQ(ua.asc, 0x2a);
  EXPECT_EQ(ua.ascq, 0x05);
  EXPECT_FALSE(ua.information.has_value()) << "VALID bit clear";

  const Sense deferred = decode_sense(hex(kPairs[1].descriptor));
  EXPECT_EQ(deferred.response_code, 0x73);
  EXPECT_TRUE(deferred.deferred);

  EXPECT_EQ(decode_sense(hex(kPairs[2].fixed)).information, 0x12345678U);
  EXPECT_EQ(decode_sense(hex(kPairs[2].descriptor)).information, 0x12345678U);
}

// sg_decode_sense: "Descriptor type: Sense key specific ... Descriptor type: Information".
TEST(Sense, FindsInformationAfterOtherDescriptors) {
  const Sense sense = decode_sense(
      hex("72 03 11 00 00 00 00 14 02 06 00 00 80 00 00 00 00 0a 80 00 00 00 00 00 12 34 56 78"));
  EXPECT_EQ(sense.information, 0x12345678U);
  EXPECT_FALSE(sense.truncated);
  // VALID bit clear in the information descriptor: no information.
  EXPECT_FALSE(decode_sense(hex("72 03 11 00 00 00 00 0c 00 0a 00 00 00 00 00 00 12 34 56 78"))
                   .information.has_value());
}

// Fixed: ADDITIONAL SENSE LENGTH bounds what is read (as sg_lib.c does).
TEST(Sense, FixedAdditionalSenseLengthAtEveryLimit) {
  struct Case {
    std::uint8_t length;
    std::uint8_t asc;
    std::uint8_t ascq;
    bool truncated;
  };
  for (const Case c :
       {Case{0, 0, 0, true}, Case{1, 0, 0, true}, Case{5, 0x29, 0, true},
        Case{6, 0x29, 0x07, false}, Case{10, 0x29, 0x07, false}, Case{255, 0x29, 0x07, true}}) {
    std::vector<std::uint8_t> bytes = hex("70 00 06 00 00 00 00 0a 00 00 00 00 29 07 00 00 00 00");
    bytes[7] = c.length;
    const Sense sense = decode_sense(bytes);
    EXPECT_EQ(sense.sense_key, SenseKey::kUnitAttention) << int{c.length};
    EXPECT_EQ(sense.asc, c.asc) << int{c.length};
    EXPECT_EQ(sense.ascq, c.ascq) << int{c.length};
    EXPECT_EQ(sense.truncated, c.truncated) << int{c.length};
    EXPECT_EQ(classify(sense), SenseCategory::kUnitAttention);
  }
}

// Descriptor: ASC/ASCQ live in the header; ADDITIONAL SENSE LENGTH bounds the descriptors.
TEST(Sense, DescriptorAdditionalSenseLengthAtEveryLimit) {
  struct Case {
    std::uint8_t length;
    bool information;
    bool truncated;
  };
  for (const Case c : {Case{0, false, false}, Case{1, false, true}, Case{11, false, true},
                       Case{12, true, false}, Case{255, true, true}}) {
    std::vector<std::uint8_t> bytes =
        hex("72 03 11 00 00 00 00 0c 00 0a 80 00 00 00 00 00 12 34 56 78");
    bytes[7] = c.length;
    const Sense sense = decode_sense(bytes);
    EXPECT_EQ(sense.asc, 0x11) << int{c.length};
    EXPECT_EQ(sense.information.has_value(), c.information) << int{c.length};
    EXPECT_EQ(sense.truncated, c.truncated) << int{c.length};
  }
  // A descriptor whose own length runs past the list is not read.
  const Sense lying =
      decode_sense(hex("72 03 11 00 00 00 00 0c 00 ff 80 00 00 00 00 00 12 34 56 78"));
  EXPECT_FALSE(lying.information.has_value());
  EXPECT_TRUE(lying.truncated);
}

// Every prefix of a sense buffer decodes without reading past it (run under ASan in CI), keeps
// what it had, and is flagged until it is complete.
TEST(Sense, EveryPrefixDecodesWhatItCan) {
  for (const Pair& pair : kPairs) {
    for (const char* text : {pair.fixed, pair.descriptor}) {
      const std::vector<std::uint8_t> bytes = hex(text);
      const Sense whole = decode_sense(bytes);
      for (std::size_t size = 0; size < bytes.size(); ++size) {
        const Sense cut = decode_sense(Bytes(bytes).first(size));
        EXPECT_TRUE(cut.truncated) << pair.name << " cut at " << size;
        if (size >= 3) {
          EXPECT_EQ(cut.sense_key, whole.sense_key) << pair.name << " cut at " << size;
        }
      }
    }
  }
  // sg_decode_sense "72 06 2a": Unit Attention, ASC 2Ah.
  const Sense three = decode_sense(hex("72 06 2a"));
  EXPECT_EQ(three.sense_key, SenseKey::kUnitAttention);
  EXPECT_EQ(three.asc, 0x2a);
  EXPECT_TRUE(three.truncated);
}

TEST(Sense, GarbageIsUnknownAndClassifiedOther) {
  for (const char* text : {"", "00 00 06 00 00 00 00 0a 00 00 00 00 2a 05",
                           "7f 00 06 00 00 00 00 0a 00 00 00 00 2a 05", "74 06 2a 05", "ff"}) {
    const Sense sense = decode_sense(hex(text));
    EXPECT_EQ(sense.format, SenseFormat::kUnknown) << text;
    EXPECT_EQ(sense.sense_key, SenseKey::kNoSense) << text;
    EXPECT_EQ(classify(sense), SenseCategory::kOther) << text;
  }
  EXPECT_TRUE(decode_sense({}).truncated);
}

TEST(Sense, ClassifiesForRetryPolicy) {
  struct Case {
    const char* descriptor_sense;
    SenseCategory category;
  };
  for (const Case c : {
           Case{"72 00 00 00 00 00 00 00", SenseCategory::kNoSense},
           Case{"72 01 17 00 00 00 00 00", SenseCategory::kRecovered},
           Case{"72 06 29 07 00 00 00 00", SenseCategory::kUnitAttention},
           Case{"72 02 04 01 00 00 00 00", SenseCategory::kNotReadyBecomingReady},
           Case{"72 02 04 07 00 00 00 00", SenseCategory::kNotReadyInProgress},
           Case{"72 02 04 0a 00 00 00 00", SenseCategory::kNotReadyTransitioning},
           Case{"72 02 04 0b 00 00 00 00", SenseCategory::kNotReady},
           Case{"72 02 08 00 00 00 00 00", SenseCategory::kNotReady},
           Case{"72 02 3a 00 00 00 00 00", SenseCategory::kNotReady},
           Case{"72 05 24 00 00 00 00 00", SenseCategory::kIllegalRequest},
           Case{"72 05 26 00 00 00 00 00", SenseCategory::kIllegalRequest},
           Case{"72 0b 47 00 00 00 00 00", SenseCategory::kAbortedCommand},
           Case{"72 03 11 00 00 00 00 00", SenseCategory::kMediumOrHardware},
           Case{"72 04 44 00 00 00 00 00", SenseCategory::kMediumOrHardware},
           Case{"72 07 27 00 00 00 00 00", SenseCategory::kDataProtect},
           Case{"72 0e 1d 00 00 00 00 00", SenseCategory::kOther},
           Case{"72 0d 00 00 00 00 00 00", SenseCategory::kOther},
       }) {
    EXPECT_EQ(classify(decode_sense(hex(c.descriptor_sense))), c.category) << c.descriptor_sense;
  }
}

TEST(SamStatus, WireValuesAndNames) {
  EXPECT_EQ(static_cast<int>(SamStatus::kGood), 0x00);
  EXPECT_EQ(static_cast<int>(SamStatus::kCheckCondition), 0x02);
  EXPECT_EQ(static_cast<int>(SamStatus::kConditionMet), 0x04);
  EXPECT_EQ(static_cast<int>(SamStatus::kBusy), 0x08);
  EXPECT_EQ(static_cast<int>(SamStatus::kReservationConflict), 0x18);
  EXPECT_EQ(static_cast<int>(SamStatus::kTaskSetFull), 0x28);
  EXPECT_EQ(static_cast<int>(SamStatus::kAcaActive), 0x30);
  EXPECT_EQ(static_cast<int>(SamStatus::kTaskAborted), 0x40);
  EXPECT_EQ(to_string(SamStatus::kReservationConflict), "RESERVATION CONFLICT");
  EXPECT_EQ(to_string(static_cast<SamStatus>(0x22)), "unknown status");
  EXPECT_EQ(to_string(SenseKey::kUnitAttention), "UNIT ATTENTION");
}

}  // namespace
}  // namespace blkfence::codec

// Proves INQUIRY CDBs byte for byte, that VPD 0x80 and 0x83 pages as LIO builds them decode to the
// serial, the designators and the LU's WWN Linux shows ("naa.6001405..."), that lu_wwn() prefers
// NAA, then EUI-64, then a SCSI name string, among LU designators only, and that PAGE LENGTH (0,
// 1, real, 0xffff) and DESIGNATOR LENGTH are never trusted beyond the buffer.
//
// Cross-checked offline against sg3_utils 1.46: with the two golden pages below written as hex to
// vpd80.hex and vpd83.hex, `sg_vpd --inhex=vpd80.hex -p 0x80` prints "Unit serial number:
// 8b4b7f52-1f8e-4f4e-9d2a-2b1a4c6f1e01", `sg_vpd --inhex=vpd83.hex -p 0x83 -l` lists the same seven
// designators (NAA 6 with IEEE Company_id 0x1405; T10 "LIO-ORG" / "pgdata0:8b4b..."; LU group 0;
// SAS relative target port 1, target port group 0, SCSI name strings for the target port and the
// target device), and `sg_vpd --inhex=vpd83.hex -p 0x83 -ii` prints the LU designator
// 0x60014058b4b7f521f8e4f4e9d2a2b1a4. The CDBs match what `sg_inq -vvv [-p 0x83] /tmp/fakedev`
// prints before its ioctl fails on a regular file: "inquiry cdb: [12 00 00 00 24 00]",
// "[12 01 00 00 fc 00]".
#include "blkfence/codec/inquiry.h"

#include <gtest/gtest.h>

#include "blkfence/testing/test_bytes.h"

namespace blkfence::codec {
namespace {

using test::ascii;
using test::hex;

std::vector<std::uint8_t> cdb_bytes(const Cdb6& cdb) {
  return {cdb.begin(), cdb.end()};
}

constexpr const char* kSerial = "8b4b7f52-1f8e-4f4e-9d2a-2b1a4c6f1e01";

// spc_emulate_evpd_80(): the serial and its NUL.
const std::vector<std::uint8_t> kVpd80 = test::concat({hex("00 80 00 25"), ascii(kSerial, 37)});

// spc_emulate_evpd_83() for a tcm_loop (SAS) LUN with that serial: NAA 6 from the serial (OUI
// 001405), T10 vendor id, relative target port 1, target port group 0, LU group 0, and SCSI name
// strings for the target port and the target device.
const std::vector<std::uint8_t> kVpd83 = test::concat({
    hex("00 83 00 a5"),
    hex("01 03 00 10 60 01 40 58 b4 b7 f5 21 f8 e4 f4 e9 d2 a2 b1 a4"),
    hex("02 01 00 35"),
    ascii("LIO-ORG pgdata0:8b4b7f52-1f8e-4f4e-9d2a-2b1a4c6f1e01", 0x35),
    hex("61 94 00 04 00 00 00 01"),
    hex("61 95 00 04 00 00 00 00"),
    hex("01 06 00 04 00 00 00 00"),
    hex("63 98 00 20"),
    ascii("naa.5001405aabbccdd0,t,0x0001", 0x20),
    hex("63 a8 00 18"),
    ascii("naa.5001405aabbccdd0", 0x18),
});

TEST(InquiryCdb, StandardAndVpd) {
  EXPECT_EQ(cdb_bytes(encode_inquiry_cdb(36)), hex("12 00 00 00 24 00"));
  EXPECT_EQ(cdb_bytes(encode_inquiry_vpd_cdb(VpdPage::kSupportedPages, 0xfc)),
            hex("12 01 00 00 fc 00"));
  EXPECT_EQ(cdb_bytes(encode_inquiry_vpd_cdb(VpdPage::kDeviceIdentification, 0xfc)),
            hex("12 01 83 00 fc 00"));
  EXPECT_EQ(cdb_bytes(encode_inquiry_vpd_cdb(VpdPage::kUnitSerialNumber, 0)),
            hex("12 01 80 00 00 00"));
  EXPECT_EQ(cdb_bytes(encode_inquiry_vpd_cdb(VpdPage::kUnitSerialNumber, 1)),
            hex("12 01 80 00 01 00"));
  EXPECT_EQ(cdb_bytes(encode_inquiry_vpd_cdb(VpdPage::kUnitSerialNumber, 0xffff)),
            hex("12 01 80 ff ff 00"));
}

TEST(VpdUnitSerial, DecodesLioGoldenAndTrims) {
  const auto serial = decode_vpd_unit_serial(kVpd80);
  ASSERT_TRUE(serial.has_value()) << serial.error().message();
  EXPECT_EQ(serial->serial, kSerial);
  EXPECT_EQ(serial->page_length, 37);
  EXPECT_FALSE(serial->truncated);
  // SPC-4 pads with spaces.
  const auto padded =
      decode_vpd_unit_serial(test::concat({hex("00 80 00 0c"), ascii("  ABC123    ", 12)}));
  ASSERT_TRUE(padded.has_value());
  EXPECT_EQ(padded->serial, "ABC123");
}

TEST(VpdUnitSerial, PageLengthAtEveryLimit) {
  struct Case {
    std::uint16_t page_length;
    std::string serial;
    bool truncated;
  };
  for (const Case& c :
       {Case{0, "", false}, Case{1, "8", false}, Case{36, kSerial, false}, Case{37, kSerial, false},
        Case{38, kSerial, true}, Case{0xffff, kSerial, true}}) {
    std::vector<std::uint8_t> page = kVpd80;
    store_be16(page, 2, c.page_length);
    const auto serial = decode_vpd_unit_serial(page);
    ASSERT_TRUE(serial.has_value());
    EXPECT_EQ(serial->serial, c.serial) << c.page_length;
    EXPECT_EQ(serial->truncated, c.truncated) << c.page_length;
  }
}

TEST(VpdDeviceIdentification, DecodesLioGolden) {
  const auto id = decode_vpd_device_identification(kVpd83);
  ASSERT_TRUE(id.has_value()) << id.error().message();
  EXPECT_EQ(id->page_length, 0xa5);
  EXPECT_FALSE(id->truncated);
  ASSERT_EQ(id->designators.size(), 7U);

  const Designator& naa = id->designators[0];
  EXPECT_EQ(naa.type, DesignatorType::kNaa);
  EXPECT_EQ(naa.association, Association::kLogicalUnit);
  EXPECT_EQ(naa.code_set, CodeSet::kBinary);
  EXPECT_FALSE(naa.piv);
  EXPECT_EQ(designator_string(naa), "naa.60014058b4b7f521f8e4f4e9d2a2b1a4");

  EXPECT_EQ(designator_string(id->designators[1]),
            "t10.LIO-ORG pgdata0:8b4b7f52-1f8e-4f4e-9d2a-2b1a4c6f1e01");

  const Designator& rtpi = id->designators[2];
  EXPECT_EQ(rtpi.type, DesignatorType::kRelativeTargetPort);
  EXPECT_EQ(rtpi.association, Association::kTargetPort);
  EXPECT_TRUE(rtpi.piv);
  EXPECT_EQ(rtpi.protocol, ProtocolId::kSas);
  EXPECT_EQ(load_be16(rtpi.value, 2), 1);
  EXPECT_FALSE(designator_string(rtpi).has_value());

  EXPECT_EQ(id->designators[3].type, DesignatorType::kTargetPortGroup);
  EXPECT_EQ(id->designators[4].type, DesignatorType::kLogicalUnitGroup);
  EXPECT_EQ(id->designators[4].association, Association::kLogicalUnit);

  const Designator& port_name = id->designators[5];
  EXPECT_EQ(port_name.type, DesignatorType::kScsiNameString);
  EXPECT_EQ(port_name.code_set, CodeSet::kUtf8);
  EXPECT_EQ(designator_string(port_name), "naa.5001405aabbccdd0,t,0x0001");
  EXPECT_EQ(id->designators[6].association, Association::kTargetDevice);
  EXPECT_EQ(designator_string(id->designators[6]), "naa.5001405aabbccdd0");

  EXPECT_EQ(lu_wwn(*id), "naa.60014058b4b7f521f8e4f4e9d2a2b1a4");
}

// Builds a 0x83 page from designation descriptors.
std::vector<std::uint8_t> page83(std::initializer_list<std::vector<std::uint8_t>> descriptors) {
  std::vector<std::uint8_t> page = hex("00 83 00 00");
  for (const auto& d : descriptors) {
    page.insert(page.end(), d.begin(), d.end());
  }
  store_be16(page, 2, static_cast<std::uint16_t>(page.size() - 4));
  return page;
}

const std::vector<std::uint8_t> kEui64 = hex("01 02 00 08 00 14 05 00 00 00 00 2a");
const std::vector<std::uint8_t> kNaa5 = hex("01 03 00 08 50 01 40 50 00 00 00 01");
const std::vector<std::uint8_t> kLuName =
    test::concat({hex("03 08 00 18"), ascii("iqn.2003-01.org.example", 0x18)});

std::optional<std::string> wwn_of(std::initializer_list<std::vector<std::uint8_t>> descriptors) {
  const auto id = decode_vpd_device_identification(page83(descriptors));
  EXPECT_TRUE(id.has_value());
  return id ? lu_wwn(*id) : std::nullopt;
}

TEST(VpdDeviceIdentification, LuWwnPrefersNaaThenEuiThenName) {
  EXPECT_EQ(wwn_of({kLuName, kEui64, kNaa5}), "naa.5001405000000001");
  EXPECT_EQ(wwn_of({kLuName, kEui64}), "eui.001405000000002a");
  EXPECT_EQ(wwn_of({kLuName}), "iqn.2003-01.org.example");
  // A NAA of the target port (association 01b) is not the LU's.
  EXPECT_EQ(wwn_of({hex("61 93 00 08 50 01 40 50 00 00 00 09"), kEui64}), "eui.001405000000002a");
  // A NAA in the wrong code set, an empty name, and T10 vendor ids do not qualify.
  EXPECT_EQ(wwn_of({hex("02 03 00 08 35 30 30 31 34 30 35 30"), hex("03 08 00 04 00 00 00 00"),
                    test::concat({hex("02 01 00 08"), ascii("LIO-ORG ", 8)})}),
            std::nullopt);
  EXPECT_EQ(wwn_of({}), std::nullopt);
}

TEST(VpdDeviceIdentification, PageLengthAtEveryLimit) {
  struct Case {
    std::uint16_t page_length;
    std::size_t designators;
    bool truncated;
  };
  for (const Case c : {Case{0, 0, false}, Case{1, 0, true}, Case{20, 1, false}, Case{21, 1, true},
                       Case{0xa5, 7, false}, Case{0xa6, 7, true}, Case{0xffff, 7, true}}) {
    std::vector<std::uint8_t> page = kVpd83;
    store_be16(page, 2, c.page_length);
    const auto id = decode_vpd_device_identification(page);
    ASSERT_TRUE(id.has_value());
    EXPECT_EQ(id->designators.size(), c.designators) << c.page_length;
    EXPECT_EQ(id->truncated, c.truncated) << c.page_length;
  }
}

// Every cut of the page keeps complete designators only (run under ASan in CI); the WWN survives
// as soon as the NAA designator is whole.
TEST(VpdDeviceIdentification, EveryCutOfTheBufferIsSafe) {
  for (std::size_t size = 4; size < kVpd83.size(); ++size) {
    const auto id = decode_vpd_device_identification(Bytes(kVpd83).first(size));
    ASSERT_TRUE(id.has_value());
    EXPECT_TRUE(id->truncated) << size;
    EXPECT_EQ(lu_wwn(*id).has_value(), size >= 24) << size;
  }
}

TEST(VpdDeviceIdentification, DesignatorLengthIsNotTrusted) {
  std::vector<std::uint8_t> page = kVpd83;
  page[4 + 3] = 0xff;  // the NAA designator claims 255 bytes
  auto id = decode_vpd_device_identification(page);
  ASSERT_TRUE(id.has_value());
  EXPECT_TRUE(id->truncated);
  // 255 bytes do not fit in the 0xa5-byte page: nothing is decoded from a lying descriptor.
  EXPECT_TRUE(id->designators.empty());
}

TEST(Vpd, ShortHeaderAndWrongPageAreErrors) {
  for (std::size_t size = 0; size < 4; ++size) {
    EXPECT_EQ(decode_vpd_device_identification(Bytes(kVpd83).first(size)).error().code(),
              ErrorCode::kTruncated);
    EXPECT_EQ(decode_vpd_unit_serial(Bytes(kVpd80).first(size)).error().code(),
              ErrorCode::kTruncated);
  }
  EXPECT_EQ(decode_vpd_device_identification(kVpd80).error().code(), ErrorCode::kNotSupported);
  EXPECT_EQ(decode_vpd_unit_serial(kVpd83).error().code(), ErrorCode::kNotSupported);
  EXPECT_EQ(decode_vpd_unit_serial(kVpd83).error().where(),
            "VPD page 0x80: the device answered page 0x83");
}

}  // namespace
}  // namespace blkfence::codec

// Proves PR IN CDBs byte for byte (docs/reference/spc4-pr.md §11 verbatim) and that every PR IN
// decoder reads golden responses laid out as LIO writes them, never reads past the buffer whatever
// a length field claims (each tried at 0, 1, the real size, the type's maximum and more than the
// buffer holds), reports truncation with the device's claim, and fails only below the header.
//
// Goldens follow SPC-4 6.15 and LIO's writers (target_core_pr.c: core_scsi3_pri_read_keys(),
// core_scsi3_pri_read_reservation(), core_scsi3_pri_report_capabilities(),
// core_scsi3_pri_read_full_status(); TransportIDs from target_core_fabric_lib.c). sg_persist 1.46
// has no --inhex, so they were cross-checked through an LD_PRELOAD shim whose ioctl(SG_IO) copies
// a hex file into dxferp, sets resid and status GOOD (about 25 lines of C, not kept in the tree):
//   SHIM_RESPONSE=golden.hex LD_PRELOAD=./sgio_shim.so sg_persist -n -{k,r,c,s} /tmp/fakedev
// sg_persist decodes kReadKeys, kReadReservation (and the no-reservation header), both
// REPORT CAPABILITIES goldens and kFullStatus to the same fields as below. Given kReadKeys with
// ADDITIONAL LENGTH 24 it prints a third key 0x0 that the device never sent (it trusts the
// length within its zeroed buffer); decode_read_keys() returns two keys and truncated.
// The CDBs were compared with what sg_persist prints before its ioctl fails on a regular file:
// `sg_persist -n -k -l 2000 -vv /tmp/fakedev` gives "Persistent reservation in cdb: [5e 00 00 00 00
// 00 00 20 00 00]", likewise -r -l 18, -c -l 8, and -s (at its 8192 maximum: 16 KiB is beyond
// sg_persist) gives [5e 03 00 00 00 00 00 20 00 00].
#include "blkfence/codec/prin.h"

#include <gtest/gtest.h>

#include "blkfence/testing/test_bytes.h"

namespace blkfence::codec {
namespace {

using test::cdb_bytes;
using test::hex;
using test::kKeyA;
using test::kKeyB;

// Replaces the 32-bit ADDITIONAL LENGTH (bytes 4-7) of a PR IN response.
std::vector<std::uint8_t> with_additional_length(std::vector<std::uint8_t> response,
                                                 std::uint32_t length) {
  store_be32(response, 4, length);
  return response;
}

TEST(PrinCdb, WorkedExamplesOfTheReference) {
  EXPECT_EQ(cdb_bytes(encode_prin_cdb(PrInAction::kReadKeys, 8192)),
            hex("5E 00 00 00 00 00 00 20 00 00"));
  EXPECT_EQ(cdb_bytes(encode_prin_cdb(PrInAction::kReadReservation, 24)),
            hex("5E 01 00 00 00 00 00 00 18 00"));
  EXPECT_EQ(cdb_bytes(encode_prin_cdb(PrInAction::kReportCapabilities, 8)),
            hex("5E 02 00 00 00 00 00 00 08 00"));
  EXPECT_EQ(cdb_bytes(encode_prin_cdb(PrInAction::kReadFullStatus, 16384)),
            hex("5E 03 00 00 00 00 00 40 00 00"));
}

TEST(PrinCdb, AllocationLengthAtItsLimits) {
  EXPECT_EQ(cdb_bytes(encode_prin_cdb(PrInAction::kReadKeys, 0)),
            hex("5e 00 00 00 00 00 00 00 00 00"));
  EXPECT_EQ(cdb_bytes(encode_prin_cdb(PrInAction::kReadKeys, 1)),
            hex("5e 00 00 00 00 00 00 00 01 00"));
  EXPECT_EQ(cdb_bytes(encode_prin_cdb(PrInAction::kReadKeys, 0xffff)),
            hex("5e 00 00 00 00 00 00 ff ff 00"));
  EXPECT_EQ(to_string(PrInAction::kReadFullStatus), "READ FULL STATUS");
}

// Every decoder refuses a response shorter than its fixed header, down to empty.
TEST(PrinDecode, ShorterThanTheHeaderIsAnError) {
  const std::vector<std::uint8_t> header = hex("00 00 00 03 00 00 00 00");
  for (std::size_t size = 0; size < header.size(); ++size) {
    const Bytes cut = Bytes(header).first(size);
    EXPECT_EQ(decode_read_keys(cut).error().code(), ErrorCode::kTruncated) << size;
    EXPECT_EQ(decode_read_reservation(cut).error().code(), ErrorCode::kTruncated) << size;
    EXPECT_EQ(decode_read_full_status(cut).error().code(), ErrorCode::kTruncated) << size;
  }
  const std::vector<std::uint8_t> capabilities = hex("00 08 1d 90 ea 01 00 00");
  for (std::size_t size = 0; size < 6; ++size) {
    EXPECT_EQ(decode_report_capabilities(Bytes(capabilities).first(size)).error().code(),
              ErrorCode::kTruncated)
        << size;
  }
}

// --- READ KEYS ------------------------------------------------------------------------------

// PRgeneration 3, keys A and B registered.
const std::vector<std::uint8_t> kReadKeys =
    hex("00 00 00 03 00 00 00 10 4c 49 4f 00 00 00 00 01 4c 49 4f 00 00 00 00 02");

TEST(PrinReadKeys, DecodesGolden) {
  const auto keys = decode_read_keys(kReadKeys);
  ASSERT_TRUE(keys.has_value()) << keys.error().message();
  EXPECT_EQ(keys->generation, 3U);
  EXPECT_EQ(keys->keys, (std::vector<std::uint64_t>{kKeyA, kKeyB}));
  EXPECT_EQ(keys->additional_length, 16U);
  EXPECT_FALSE(keys->truncated);
}

TEST(PrinReadKeys, AdditionalLengthAtEveryLimit) {
  struct Case {
    std::uint32_t additional_length;
    std::size_t keys;
    bool truncated;
  };
  for (const Case c : {Case{0, 0, false}, Case{1, 0, true}, Case{8, 1, false}, Case{9, 1, true},
                       Case{16, 2, false}, Case{24, 2, true}, Case{0xfffffff8U, 2, true},
                       Case{0xffffffffU, 2, true}}) {
    const auto keys = decode_read_keys(with_additional_length(kReadKeys, c.additional_length));
    ASSERT_TRUE(keys.has_value());
    EXPECT_EQ(keys->keys.size(), c.keys) << c.additional_length;
    EXPECT_EQ(keys->truncated, c.truncated) << c.additional_length;
    EXPECT_EQ(keys->additional_length, c.additional_length);
  }
}

// LIO keeps ADDITIONAL LENGTH at 8 per registration but copies only the keys that fit.
TEST(PrinReadKeys, LioShortAllocationKeepsTheClaim) {
  for (std::size_t size = 8; size <= kReadKeys.size(); ++size) {
    const auto keys = decode_read_keys(Bytes(kReadKeys).first(size));
    ASSERT_TRUE(keys.has_value());
    EXPECT_EQ(keys->keys.size(), (size - 8) / 8) << size;
    EXPECT_EQ(keys->truncated, size < kReadKeys.size()) << size;
    EXPECT_EQ(keys->additional_length, 16U);
  }
}

// --- READ RESERVATION -----------------------------------------------------------------------

// B holds Write Exclusive - Registrants Only (5h), LU_SCOPE.
const std::vector<std::uint8_t> kReadReservation =
    hex("00 00 00 03 00 00 00 10 4c 49 4f 00 00 00 00 02 00 00 00 00 00 05 00 00");

TEST(PrinReadReservation, DecodesGolden) {
  const auto result = decode_read_reservation(kReadReservation);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->generation, 3U);
  ASSERT_TRUE(result->reservation.has_value());
  EXPECT_EQ(result->reservation->key, kKeyB);
  EXPECT_EQ(result->reservation->type, PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_EQ(result->reservation->scope, 0);
  EXPECT_FALSE(result->truncated);
}

TEST(PrinReadReservation, NoReservationAndAllRegistrants) {
  const auto none = decode_read_reservation(hex("00 00 00 07 00 00 00 00"));
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->reservation.has_value());
  EXPECT_FALSE(none->truncated);
  EXPECT_EQ(none->generation, 7U);
  // SPC-4 5.13.10: key 0 under an all-registrants type.
  const auto all =
      decode_read_reservation(hex("00 00 00 03 00 00 00 10 00×8 00 00 00 00 00 07 00 00"));
  ASSERT_TRUE(all.has_value() && all->reservation.has_value());
  EXPECT_EQ(all->reservation->key, 0U);
  EXPECT_TRUE(is_all_registrants(all->reservation->type));
}

// LIO with 8 <= allocation length < 22 and a reservation: ADDITIONAL LENGTH 16, no key or type.
// That is "unknown", never "no reservation".
TEST(PrinReadReservation, LioShortAllocationIsUnknownNotNone) {
  for (std::size_t size = 8; size < 22; ++size) {
    const auto result = decode_read_reservation(Bytes(kReadReservation).first(size));
    ASSERT_TRUE(result.has_value());
    EXPECT_FALSE(result->reservation.has_value()) << size;
    EXPECT_TRUE(result->truncated) << size;
  }
  const auto enough = decode_read_reservation(Bytes(kReadReservation).first(22));
  ASSERT_TRUE(enough.has_value());
  EXPECT_TRUE(enough->reservation.has_value()) << "TYPE is byte 21";
  EXPECT_TRUE(enough->truncated) << "the obsolete bytes 22-23 are still missing";
}

TEST(PrinReadReservation, AdditionalLengthAtEveryLimit) {
  struct Case {
    std::uint32_t additional_length;
    bool reservation;
    bool truncated;
  };
  for (const Case c :
       {Case{0, false, false}, Case{1, false, true}, Case{13, false, true}, Case{14, true, false},
        Case{16, true, false}, Case{17, true, true}, Case{0xffffffffU, true, true}}) {
    const auto result =
        decode_read_reservation(with_additional_length(kReadReservation, c.additional_length));
    ASSERT_TRUE(result.has_value());
    EXPECT_EQ(result->reservation.has_value(), c.reservation) << c.additional_length;
    EXPECT_EQ(result->truncated, c.truncated) << c.additional_length;
  }
}

// --- REPORT CAPABILITIES --------------------------------------------------------------------

// LIO: LENGTH 8; CRH, SIP_C, ATP_C, PTPL_C; TMV, ALLOW COMMANDS 001b; every type but the obsolete.
const std::vector<std::uint8_t> kCapabilities = hex("00 08 1d 90 ea 01 00 00");

TEST(PrinReportCapabilities, DecodesLioGolden) {
  const auto caps = decode_report_capabilities(kCapabilities);
  ASSERT_TRUE(caps.has_value()) << caps.error().message();
  EXPECT_EQ(caps->length, 8);
  EXPECT_FALSE(caps->truncated);
  EXPECT_FALSE(caps->rlr_c);
  EXPECT_TRUE(caps->crh && caps->sip_c && caps->atp_c && caps->ptpl_c && caps->tmv);
  EXPECT_EQ(caps->allow_commands, 1);
  EXPECT_FALSE(caps->ptpl_a);
  for (const PrType type :
       {PrType::kWriteExclusive, PrType::kExclusiveAccess, PrType::kWriteExclusiveRegistrantsOnly,
        PrType::kExclusiveAccessRegistrantsOnly, PrType::kWriteExclusiveAllRegistrants,
        PrType::kExclusiveAccessAllRegistrants}) {
    EXPECT_TRUE(caps->supports(type)) << static_cast<int>(type);
  }
  for (const int obsolete : {0, 2, 4}) {
    EXPECT_FALSE(caps->supports(static_cast<PrType>(obsolete)));
  }
}

TEST(PrinReportCapabilities, TypeMaskBitsAndTmv) {
  // Only WR_EX_RO (byte 4 bit 5) and EX_AC_AR (byte 5 bit 0), APTPL active.
  auto caps = decode_report_capabilities(hex("00 08 00 81 20 01 00 00"));
  ASSERT_TRUE(caps.has_value());
  EXPECT_TRUE(caps->ptpl_a);
  EXPECT_TRUE(caps->supports(PrType::kWriteExclusiveRegistrantsOnly));
  EXPECT_TRUE(caps->supports(PrType::kExclusiveAccessAllRegistrants));
  EXPECT_FALSE(caps->supports(PrType::kWriteExclusiveAllRegistrants));
  EXPECT_FALSE(caps->supports(PrType::kWriteExclusive));
  // TMV=0: the mask says nothing.
  caps = decode_report_capabilities(hex("00 08 00 00 ff 01 00 00"));
  ASSERT_TRUE(caps.has_value());
  EXPECT_FALSE(caps->supports(PrType::kWriteExclusiveRegistrantsOnly));
}

TEST(PrinReportCapabilities, LengthAtEveryLimit) {
  struct Case {
    std::uint16_t length;
    bool ok;
    bool truncated;
  };
  for (const Case c :
       {Case{0, false, false}, Case{1, false, false}, Case{5, false, false}, Case{6, true, false},
        Case{8, true, false}, Case{9, true, true}, Case{0xffff, true, true}}) {
    std::vector<std::uint8_t> response = kCapabilities;
    store_be16(response, 0, c.length);
    const auto caps = decode_report_capabilities(response);
    ASSERT_EQ(caps.has_value(), c.ok) << c.length;
    if (caps) {
      EXPECT_EQ(caps->truncated, c.truncated) << c.length;
      EXPECT_EQ(caps->length, c.length);
      EXPECT_EQ(caps->type_mask, 0x01ea);
    }
  }
  // LIO accepts an allocation length of 6: flags complete, reserved bytes cut.
  const auto six = decode_report_capabilities(Bytes(kCapabilities).first(6));
  ASSERT_TRUE(six.has_value());
  EXPECT_TRUE(six->truncated);
  EXPECT_TRUE(six->supports(PrType::kExclusiveAccessAllRegistrants));
}

// --- READ FULL STATUS -----------------------------------------------------------------------

// One full status descriptor as core_scsi3_pri_read_full_status() writes it: key, reserved,
// ALL_TG_PT | R_HOLDER, SCOPE | TYPE, reserved, RELATIVE TARGET PORT IDENTIFIER, ADDITIONAL
// DESCRIPTOR LENGTH, TransportID.
std::vector<std::uint8_t> descriptor(const char* key, const char* flags_scope_type,
                                     const char* rtpi, const std::vector<std::uint8_t>& tid) {
  std::vector<std::uint8_t> bytes =
      test::concat({hex(key), hex("00 00 00 00"), hex(flags_scope_type), hex("00 00 00 00"),
                    hex(rtpi), hex("00 00 00 00"), tid});
  store_be32(bytes, 20, static_cast<std::uint32_t>(tid.size()));
  return bytes;
}

std::vector<std::uint8_t> full_status(
    std::initializer_list<std::vector<std::uint8_t>> descriptors) {
  std::vector<std::uint8_t> bytes = test::concat({hex("00 00 00 05 00 00 00 00")});
  for (const auto& d : descriptors) {
    bytes.insert(bytes.end(), d.begin(), d.end());
  }
  store_be32(bytes, 4, static_cast<std::uint32_t>(bytes.size() - 8));
  return bytes;
}

// tcm_loop (SAS): A registered, B holds WE-RO; both through relative target port 1. An iSCSI
// registrant (format 01b, 52-byte TransportID) with ALL_TG_PT follows.
const std::vector<std::uint8_t> kSasA = hex("06 00 00 00 50 01 40 5a ab bc cd d1 00×12");
const std::vector<std::uint8_t> kSasB = hex("06 00 00 00 50 01 40 5a ab bc cd d2 00×12");
const std::vector<std::uint8_t> kIscsiC = test::concat(
    {hex("45 00 00 30"), test::ascii("iqn.1994-05.com.redhat:node3,i,0x23d000000001", 48)});
const std::vector<std::uint8_t> kFullStatus = full_status({
    descriptor("4c 49 4f 00 00 00 00 01", "00 00", "00 01", kSasA),
    descriptor("4c 49 4f 00 00 00 00 02", "01 05", "00 01", kSasB),
    descriptor("4c 49 4f 00 00 00 00 03", "02 00", "00 00", kIscsiC),
});

TEST(PrinReadFullStatus, DecodesGolden) {
  ASSERT_EQ(kFullStatus.size(), 8U + 48 + 48 + 76);
  const auto status = decode_read_full_status(kFullStatus);
  ASSERT_TRUE(status.has_value()) << status.error().message();
  EXPECT_EQ(status->generation, 5U);
  EXPECT_EQ(status->additional_length, 172U);
  EXPECT_FALSE(status->truncated);
  ASSERT_EQ(status->descriptors.size(), 3U);

  const FullStatusDescriptor& a = status->descriptors[0];
  EXPECT_EQ(a.key, kKeyA);
  EXPECT_FALSE(a.holder);
  EXPECT_FALSE(a.all_tg_pt);
  EXPECT_EQ(a.relative_target_port_id, 1);
  EXPECT_EQ(a.transport_id, sas_transport_id(0x5001405aabbccdd1ULL));

  const FullStatusDescriptor& b = status->descriptors[1];
  EXPECT_EQ(b.key, kKeyB);
  EXPECT_TRUE(b.holder);
  EXPECT_EQ(b.type, PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_EQ(b.scope, 0);
  EXPECT_EQ(b.transport_id, sas_transport_id(0x5001405aabbccdd2ULL));

  const FullStatusDescriptor& c = status->descriptors[2];
  EXPECT_TRUE(c.all_tg_pt);
  EXPECT_FALSE(c.holder);
  EXPECT_EQ(c.transport_id, iscsi_transport_id("iqn.1994-05.com.redhat:node3", "23d000000001"));
}

TEST(PrinReadFullStatus, AdditionalLengthAtEveryLimit) {
  struct Case {
    std::uint32_t additional_length;
    std::size_t descriptors;
    bool truncated;
  };
  for (const Case c :
       {Case{0, 0, false}, Case{1, 0, true}, Case{24, 0, true}, Case{48, 1, false},
        Case{49, 1, true}, Case{172, 3, false}, Case{173, 3, true}, Case{0xffffffffU, 3, true}}) {
    const auto status =
        decode_read_full_status(with_additional_length(kFullStatus, c.additional_length));
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->descriptors.size(), c.descriptors) << c.additional_length;
    EXPECT_EQ(status->truncated, c.truncated) << c.additional_length;
  }
}

// Cutting the buffer anywhere keeps only complete descriptors and never reads past the end
// (run under ASan in CI).
TEST(PrinReadFullStatus, EveryCutOfTheBufferIsSafe) {
  for (std::size_t size = 8; size <= kFullStatus.size(); ++size) {
    const auto status = decode_read_full_status(Bytes(kFullStatus).first(size));
    ASSERT_TRUE(status.has_value());
    const std::size_t complete = size >= 180 ? 3 : size >= 104 ? 2 : size >= 56 ? 1 : 0;
    EXPECT_EQ(status->descriptors.size(), complete) << size;
    EXPECT_EQ(status->truncated, size < kFullStatus.size()) << size;
  }
}

TEST(PrinReadFullStatus, AdditionalDescriptorLengthIsNotTrusted) {
  // The body is 172 bytes, so the first descriptor can hold at most a 148-byte TransportID.
  for (const std::uint32_t tid_length : {149U, 0x7fffffffU, 0xffffffffU}) {
    std::vector<std::uint8_t> response = kFullStatus;
    store_be32(response, 8 + 20, tid_length);  // the first descriptor's
    const auto status = decode_read_full_status(response);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(status->truncated) << tid_length;
    EXPECT_TRUE(status->descriptors.empty()) << tid_length;
  }
  // A length that fits but lies cannot be detected, only contained: with 0 the SAS TransportID's
  // 24 bytes read as a descriptor of their own, and the walk still ends inside the buffer.
  std::vector<std::uint8_t> response = kFullStatus;
  store_be32(response, 8 + 20, 0);
  const auto status = decode_read_full_status(response);
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(status->descriptors.size(), 4U);
  EXPECT_FALSE(status->descriptors[0].transport_id.has_value());
  EXPECT_EQ(status->descriptors[2].key, kKeyB);
  EXPECT_FALSE(status->truncated);
}

TEST(PrinReadFullStatus, KeepsDescriptorsWithUnsupportedTransportIds) {
  const auto status = decode_read_full_status(full_status({
      descriptor("4c 49 4f 00 00 00 00 01", "00 00", "00 01", hex("04 00×23")),  // SRP
      descriptor("4c 49 4f 00 00 00 00 02", "01 07", "00 01", {}),
  }));
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(status->descriptors.size(), 2U);
  EXPECT_EQ(status->descriptors[0].key, kKeyA);
  EXPECT_FALSE(status->descriptors[0].transport_id.has_value());
  EXPECT_FALSE(status->descriptors[1].transport_id.has_value());
  EXPECT_EQ(status->descriptors[1].type, PrType::kWriteExclusiveAllRegistrants);
  EXPECT_FALSE(status->truncated);
}

}  // namespace
}  // namespace blkfence::codec

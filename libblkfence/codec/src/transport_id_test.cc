// Proves TransportIDs encode to SPC-4 7.6.4 layouts and decode back (SAS, FC, iSCSI formats 00b
// and 01b), that the iSCSI ADDITIONAL LENGTH is never trusted beyond the bytes given (tried at 0,
// 1, the real size and more), and that other protocols and malformed IDs are refused.
//
// Cross-checked offline against sg3_utils 1.46: `sg_persist -n -o -G -S 1 -X <tid> -vvv
// /tmp/fakedev` (a regular file) prints the TransportID bytes it encodes and its own decoding:
// "SAS address: 0x5001405aabbccdd1" for -X sas,5001405aabbccdd1; "FCP-2 World Wide Name: 10 00 00
// 00 c9 f3 a5 71" for -X fcp,10000000C9F3A571; "iSCSI world wide unique port id:
// iqn.1994-05.com.redhat:node1,i,0x23d000000001" for -X file=<kIscsiPortTid as hex>.
#include "blkfence/codec/transport_id.h"

#include <gtest/gtest.h>

#include "blkfence/testing/test_bytes.h"

namespace blkfence::codec {
namespace {

using test::hex;

std::vector<std::uint8_t> encode(const TransportId& id) {
  std::vector<std::uint8_t> out;
  const auto size = append_transport_id(out, id);
  EXPECT_TRUE(size.has_value()) << size.error().message();
  EXPECT_EQ(size.value_or(0), out.size());
  return out;
}

// LIO's iscsi_get_pr_transport_id() for an initiator with ISID 23d000000001: name, ",i,0x",
// ISID, NUL, padded to a multiple of 4; byte 0 = 40h (format 01b) | 05h.
const std::vector<std::uint8_t> kIscsiPortTid = test::concat(
    {hex("45 00 00 30"), test::ascii("iqn.1994-05.com.redhat:node1,i,0x23d000000001", 48)});

TEST(TransportIdGolden, SasAndFcAreTwentyFourBytes) {
  // tcm_loop: sas_get_pr_transport_id() puts the 8-byte SAS address at bytes 4-11.
  EXPECT_EQ(encode(sas_transport_id(0x5001405aabbccdd1ULL)),
            hex("06 00 00 00 50 01 40 5a ab bc cd d1 00×12"));
  // fc_get_pr_transport_id(): N_Port name at bytes 8-15.
  EXPECT_EQ(encode(fc_transport_id(0x10000000c9f3a571ULL)),
            hex("00×8 10 00 00 00 c9 f3 a5 71 00×8"));
}

TEST(TransportIdGolden, IscsiIsNulTerminatedPaddedAndAtLeast24Bytes) {
  EXPECT_EQ(encode(iscsi_transport_id("iqn.1994-05.com.redhat:node1", "23d000000001")),
            kIscsiPortTid);
  // 28 characters + NUL = 29, padded to 32.
  EXPECT_EQ(encode(iscsi_transport_id("iqn.1994-05.com.redhat:node1")),
            test::concat({hex("05 00 00 20"), test::ascii("iqn.1994-05.com.redhat:node1", 32)}));
  // SPC-4 7.6.4.6: ADDITIONAL LENGTH is at least 20 even for a short name.
  EXPECT_EQ(encode(iscsi_transport_id("iqn.x")),
            test::concat({hex("05 00 00 14"), test::ascii("iqn.x", 20)}));
}

TEST(TransportIdDecode, DecodesWhatLioWrites) {
  const auto sas = decode_transport_id(hex("06 00 00 00 50 01 40 5a ab bc cd d1 00×12"));
  ASSERT_TRUE(sas.has_value());
  EXPECT_EQ(*sas, sas_transport_id(0x5001405aabbccdd1ULL));
  EXPECT_EQ(to_string(*sas), "sas:0x5001405aabbccdd1");

  const auto fc = decode_transport_id(hex("00×8 10 00 00 00 c9 f3 a5 71 00×8"));
  ASSERT_TRUE(fc.has_value());
  EXPECT_EQ(to_string(*fc), "fc:0x10000000c9f3a571");

  const auto port = decode_transport_id(kIscsiPortTid);
  ASSERT_TRUE(port.has_value());
  EXPECT_EQ(port->iscsi_name, "iqn.1994-05.com.redhat:node1");
  EXPECT_EQ(port->isid, "23d000000001");
  EXPECT_EQ(to_string(*port), "iqn.1994-05.com.redhat:node1,i,0x23d000000001");
}

TEST(TransportIdDecode, RoundTrips) {
  for (const TransportId& id :
       {sas_transport_id(0), sas_transport_id(~0ULL), fc_transport_id(0x2100001b32a9d1e4ULL),
        iscsi_transport_id("iqn.2003-01.org.linux-iscsi.node1:sn.1234"),
        iscsi_transport_id("iqn.1994-05.com.redhat:node1", "23D000000001"),
        iscsi_transport_id(std::string(223, 'n'))}) {
    const auto back = decode_transport_id(encode(id));
    ASSERT_TRUE(back.has_value()) << to_string(id);
    EXPECT_EQ(*back, id);
  }
}

// The iSCSI ADDITIONAL LENGTH at 0, 1, the real size and past the buffer.
TEST(TransportIdDecode, IscsiAdditionalLengthIsNotTrusted) {
  std::vector<std::uint8_t> tid = kIscsiPortTid;
  store_be16(tid, 2, 0);
  EXPECT_EQ(decode_transport_id(tid).error().code(), ErrorCode::kInvalidArgument)
      << "no bytes, so no separator";
  store_be16(tid, 2, 1);
  EXPECT_FALSE(decode_transport_id(tid).has_value()) << "'i' alone has no separator";
  tid[0] = 0x05;  // format 00b: one byte of name is a (short) name
  EXPECT_EQ(decode_transport_id(tid)->iscsi_name, "i");
  tid[0] = 0x45;
  store_be16(tid, 2, 0x30);
  EXPECT_EQ(decode_transport_id(tid)->isid, "23d000000001");
  store_be16(tid, 2, 0xffff);
  EXPECT_EQ(decode_transport_id(tid)->isid, "23d000000001") << "the first NUL ends the text";
  // Without any NUL, the text ends with the buffer.
  const auto unterminated = decode_transport_id(
      test::concat({hex("05 00 ff ff"), test::ascii("iqn.1994-05.com.redhat:node1", 28)}));
  ASSERT_TRUE(unterminated.has_value());
  EXPECT_EQ(unterminated->iscsi_name, "iqn.1994-05.com.redhat:node1");
}

TEST(TransportIdDecode, RefusesShortUnknownAndMalformed) {
  EXPECT_EQ(decode_transport_id({}).error().code(), ErrorCode::kTruncated);
  EXPECT_EQ(decode_transport_id(hex("06 00 00 00 50 01 40 5a ab bc cd")).error().code(),
            ErrorCode::kTruncated);
  EXPECT_EQ(decode_transport_id(hex("00×15")).error().code(), ErrorCode::kTruncated);
  EXPECT_EQ(decode_transport_id(hex("05 00 00")).error().code(), ErrorCode::kTruncated);
  EXPECT_EQ(decode_transport_id(hex("04 00×23")).error().code(), ErrorCode::kNotSupported);
  EXPECT_EQ(decode_transport_id(hex("46 00×23")).error().code(), ErrorCode::kInvalidArgument)
      << "SAS has only format 00b";
  EXPECT_EQ(decode_transport_id(hex("85 00 00 14 00×20")).error().code(),
            ErrorCode::kInvalidArgument)
      << "format 10b is reserved for iSCSI";
  EXPECT_EQ(decode_transport_id(hex("05 00 00 14 00×20")).error().code(),
            ErrorCode::kInvalidArgument)
      << "empty name";
  // Found by tests/fuzz/transport_id_fuzz: an ISID that is not 12 hex digits (here empty, or
  // "ZZ") decoded, and could not be encoded back into a PR OUT.
  for (const char* text : {"iqn.a,i,0x", "iqn.a,i,0xZZ", "iqn.a,i,0x23d00000000"}) {
    EXPECT_EQ(decode_transport_id(test::concat({hex("45 00 00 18"), test::ascii(text, 24)}))
                  .error()
                  .code(),
              ErrorCode::kInvalidArgument)
        << text;
  }
}

TEST(TransportIdEncode, RefusesWhatIsNotAnIscsiPortOrAProtocolItKnows) {
  std::vector<std::uint8_t> out;
  EXPECT_EQ(append_transport_id(out, iscsi_transport_id("")).error().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(append_transport_id(out, iscsi_transport_id(std::string(224, 'n'))).has_value());
  EXPECT_FALSE(append_transport_id(out, iscsi_transport_id("iqn.a,i,0x1")).has_value());
  EXPECT_FALSE(append_transport_id(out, iscsi_transport_id(std::string("iqn\0a", 5))).has_value());
  EXPECT_FALSE(append_transport_id(out, iscsi_transport_id("iqn.a", "12345")).has_value());
  EXPECT_FALSE(append_transport_id(out, iscsi_transport_id("iqn.a", "23d00000000g")).has_value());
  TransportId srp;
  srp.protocol = ProtocolId::kSrp;
  EXPECT_EQ(append_transport_id(out, srp).error().code(), ErrorCode::kNotSupported);
  EXPECT_TRUE(out.empty()) << "a refused TransportID appends nothing";
}

}  // namespace
}  // namespace blkfence::codec

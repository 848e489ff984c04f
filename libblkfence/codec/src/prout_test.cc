// Proves PR OUT encoding byte for byte: the worked examples of docs/reference/spc4-pr.md §11
// verbatim, every service action, the flag bits, SPEC_I_PT TransportIDs and REGISTER AND MOVE, the
// PARAMETER LIST LENGTH field at its limits, and that combinations SPC-4 rejects are refused.
//
// Cross-checked offline against sg3_utils 1.46: sg_persist prints the CDB and parameter list it
// would send before the ioctl fails on a regular file, so each golden below was compared with
//   touch /tmp/fakedev
//   sg_persist -n -o <action options> -vv /tmp/fakedev      (-vvv also decodes TransportIDs)
// with A=0x4c494f0000000001, B=0x4c494f0000000002: -G -K A -S B; -G -S A -Y -Z; -R -K B -T 5;
// -L -K B -T 5; -C -K B; -P -K B -S A -T 5; -A -K B -S A -T 5; -I -S B; -I -S B -Z;
// -G -S A -X sas,5001405aabbccdd1; -G -S A -X iqn.2003-01.org.linux-iscsi.node1:sn.1234;
// -G -S A -X file=<the iSCSI format 01b TransportID below, as hex>;
// -M -K B -S A -Q 2 -U -Z -X fcp,10000000C9F3A571.
#include "blkfence/codec/prout.h"

#include <gtest/gtest.h>

#include "blkfence/testing/test_bytes.h"

namespace blkfence::codec {
namespace {

using test::cdb_bytes;
using test::hex;
using test::kKeyA;
using test::kKeyB;

// docs/reference/spc4-pr.md §11, the three PR OUT rows, cells pasted as they are.
TEST(ProutGolden, WorkedExamplesOfTheReference) {
  const PrOutCommand register_b = prout_register_and_ignore(kKeyB);
  EXPECT_EQ(cdb_bytes(register_b.cdb), hex("5F 06 00 00 00 00 00 00 18 00"));
  EXPECT_EQ(register_b.parameters,
            hex("00×8 │ 4C 49 4F 00 00 00 00 02 │ 00 00 00 00 │ 00 │ 00 00 00"));

  const PrOutCommand reserve_b = prout_reserve(kKeyB, PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_EQ(cdb_bytes(reserve_b.cdb), hex("5F 01 05 00 00 00 00 00 18 00"));
  EXPECT_EQ(reserve_b.parameters, hex("4C 49 4F 00 00 00 00 02 │ 00×8 │ 00×8"));

  const PrOutCommand fence_a =
      prout_preempt_and_abort(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly);
  EXPECT_EQ(cdb_bytes(fence_a.cdb), hex("5F 05 05 00 00 00 00 00 18 00"));
  EXPECT_EQ(fence_a.parameters, hex("4C 49 4F 00 00 00 00 02 │ 4C 49 4F 00 00 00 00 01 │ 00×8"));
}

struct Golden {
  const char* name = nullptr;
  PrOutCommand command;
  const char* cdb = nullptr;
  const char* parameters = nullptr;
};

// Every service action of the basic list, as sg_persist encodes it (see the file comment).
TEST(ProutGolden, EveryServiceActionMatchesSgPersist) {
  constexpr PrType kWeRo = PrType::kWriteExclusiveRegistrantsOnly;
  const Golden goldens[] = {
      {"register", prout_register(kKeyA, kKeyB), "5f 00 00 00 00 00 00 00 18 00",
       "4c 49 4f 00 00 00 00 01 4c 49 4f 00 00 00 00 02 00×8"},
      {"register all_tg_pt aptpl", prout_register(0, kKeyA, {.all_tg_pt = true, .aptpl = true}),
       "5f 00 00 00 00 00 00 00 18 00", "00×8 4c 49 4f 00 00 00 00 01 00 00 00 00 05 00 00 00"},
      {"reserve", prout_reserve(kKeyB, kWeRo), "5f 01 05 00 00 00 00 00 18 00",
       "4c 49 4f 00 00 00 00 02 00×16"},
      {"release", prout_release(kKeyB, kWeRo), "5f 02 05 00 00 00 00 00 18 00",
       "4c 49 4f 00 00 00 00 02 00×16"},
      {"clear", prout_clear(kKeyB), "5f 03 00 00 00 00 00 00 18 00",
       "4c 49 4f 00 00 00 00 02 00×16"},
      {"preempt", prout_preempt(kKeyB, kKeyA, kWeRo), "5f 04 05 00 00 00 00 00 18 00",
       "4c 49 4f 00 00 00 00 02 4c 49 4f 00 00 00 00 01 00×8"},
      {"preempt and abort WE-AR",
       prout_preempt_and_abort(kKeyB, kKeyA, PrType::kWriteExclusiveAllRegistrants),
       "5f 05 07 00 00 00 00 00 18 00", "4c 49 4f 00 00 00 00 02 4c 49 4f 00 00 00 00 01 00×8"},
      {"register and ignore aptpl",
       prout_register_and_ignore(kKeyB, {.all_tg_pt = false, .aptpl = true}),
       "5f 06 00 00 00 00 00 00 18 00", "00×8 4c 49 4f 00 00 00 00 02 00 00 00 00 01 00 00 00"},
  };
  for (const Golden& golden : goldens) {
    EXPECT_EQ(cdb_bytes(golden.command.cdb), hex(golden.cdb)) << golden.name;
    EXPECT_EQ(golden.command.parameters, hex(golden.parameters)) << golden.name;
  }
}

// What LIO extracts (target_scsi3_emulate_pr_out(): sa = cdb[1] & 0x1f, scope = cdb[2] & 0xf0,
// type = cdb[2] & 0x0f, length from bytes 5-8) is what was encoded, for every action and type.
TEST(ProutCdb, RoundTripsThroughLioFieldExtraction) {
  const PrType types[] = {PrType::kWriteExclusive,
                          PrType::kExclusiveAccess,
                          PrType::kWriteExclusiveRegistrantsOnly,
                          PrType::kExclusiveAccessRegistrantsOnly,
                          PrType::kWriteExclusiveAllRegistrants,
                          PrType::kExclusiveAccessAllRegistrants};
  for (std::uint8_t sa = 0; sa <= 7; ++sa) {
    for (const PrType type : types) {
      const Cdb10 cdb = encode_prout_cdb(static_cast<PrOutAction>(sa), type, 24);
      EXPECT_EQ(cdb[0], 0x5f);
      EXPECT_EQ(cdb[1] & 0x1f, sa);
      EXPECT_EQ(cdb[2] & 0xf0, 0) << "SCOPE must be LU_SCOPE";
      EXPECT_EQ(cdb[2] & 0x0f, static_cast<int>(type));
      EXPECT_EQ(load_be32(cdb, 5), 24U);
      EXPECT_EQ(cdb[3] | cdb[4] | cdb[9], 0) << "reserved bytes and CONTROL stay 0";
    }
  }
}

// The wire codes are SPC-4's, not <linux/pr.h>'s enum pr_type (1..6).
TEST(ProutCdb, TypeCodesAreSpcWireCodes) {
  EXPECT_EQ(static_cast<int>(PrType::kWriteExclusive), 1);
  EXPECT_EQ(static_cast<int>(PrType::kExclusiveAccess), 3);
  EXPECT_EQ(static_cast<int>(PrType::kWriteExclusiveRegistrantsOnly), 5);
  EXPECT_EQ(static_cast<int>(PrType::kExclusiveAccessRegistrantsOnly), 6);
  EXPECT_EQ(static_cast<int>(PrType::kWriteExclusiveAllRegistrants), 7);
  EXPECT_EQ(static_cast<int>(PrType::kExclusiveAccessAllRegistrants), 8);
  EXPECT_TRUE(is_all_registrants(PrType::kExclusiveAccessAllRegistrants));
  EXPECT_FALSE(is_all_registrants(PrType::kWriteExclusiveRegistrantsOnly));
  EXPECT_EQ(to_string(PrType::kWriteExclusiveRegistrantsOnly), "Write Exclusive, registrants only");
  EXPECT_EQ(to_string(static_cast<PrType>(2)), "obsolete or unknown type");
  EXPECT_EQ(to_string(PrOutAction::kPreemptAndAbort), "PREEMPT AND ABORT");
}

// PARAMETER LIST LENGTH is 32 bits in bytes 5-8 (sd.c); 0, 1 and the maximum land there intact
// (max + 1 does not fit the type).
TEST(ProutCdb, ParameterListLengthAtItsLimits) {
  EXPECT_EQ(cdb_bytes(encode_prout_cdb(PrOutAction::kClear, std::nullopt, 0)),
            hex("5f 03 00 00 00 00 00 00 00 00"));
  EXPECT_EQ(cdb_bytes(encode_prout_cdb(PrOutAction::kClear, std::nullopt, 1)),
            hex("5f 03 00 00 00 00 00 00 01 00"));
  EXPECT_EQ(cdb_bytes(encode_prout_cdb(PrOutAction::kClear, std::nullopt, 0xffffffffU)),
            hex("5f 03 00 00 00 ff ff ff ff 00"));
}

TEST(ProutSpecIPt, AppendsSasTransportIdLikeSgPersist) {
  PrOutParameters parameters;
  parameters.sa_key = kKeyA;
  parameters.spec_i_pt = true;
  parameters.transport_ids = {sas_transport_id(0x5001405aabbccdd1ULL)};
  const auto command = encode_prout(PrOutAction::kRegister, std::nullopt, parameters);
  ASSERT_TRUE(command.has_value()) << command.error().message();
  EXPECT_EQ(cdb_bytes(command->cdb), hex("5f 00 00 00 00 00 00 00 34 00"));
  EXPECT_EQ(command->parameters, hex("00×8 4c 49 4f 00 00 00 00 01 00 00 00 00 08 00 00 00"
                                     " 00 00 00 18 06 00 00 00 50 01 40 5a ab bc cd d1 00×12"));
}

TEST(ProutSpecIPt, AppendsIscsiTransportIdsLikeSgPersist) {
  PrOutParameters parameters;
  parameters.sa_key = kKeyA;
  parameters.spec_i_pt = true;
  parameters.transport_ids = {iscsi_transport_id("iqn.2003-01.org.linux-iscsi.node1:sn.1234")};
  auto command = encode_prout(PrOutAction::kRegister, std::nullopt, parameters);
  ASSERT_TRUE(command.has_value()) << command.error().message();
  EXPECT_EQ(cdb_bytes(command->cdb), hex("5f 00 00 00 00 00 00 00 4c 00"));
  EXPECT_EQ(command->parameters,
            test::concat({hex("00×8 4c 49 4f 00 00 00 00 01 00 00 00 00 08 00 00 00"
                              " 00 00 00 30 05 00 00 2c"),
                          test::ascii("iqn.2003-01.org.linux-iscsi.node1:sn.1234", 44)}));

  // Format 01b (name and ISID) as sg_persist -vvv decodes it: "iSCSI world wide unique port id".
  parameters.transport_ids = {iscsi_transport_id("iqn.1994-05.com.redhat:node1", "23d000000001")};
  command = encode_prout(PrOutAction::kRegister, std::nullopt, parameters);
  ASSERT_TRUE(command.has_value()) << command.error().message();
  EXPECT_EQ(cdb_bytes(command->cdb), hex("5f 00 00 00 00 00 00 00 50 00"));
  EXPECT_EQ(command->parameters,
            test::concat({hex("00×8 4c 49 4f 00 00 00 00 01 00 00 00 00 08 00 00 00"
                              " 00 00 00 34 45 00 00 30"),
                          test::ascii("iqn.1994-05.com.redhat:node1,i,0x23d000000001", 48)}));
}

TEST(ProutSpecIPt, CountsEveryTransportIdInTheDataLength) {
  PrOutParameters parameters;
  parameters.sa_key = kKeyA;
  parameters.spec_i_pt = true;
  const auto none = encode_prout(PrOutAction::kRegister, std::nullopt, parameters);
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->parameters.size(), 28U);
  EXPECT_EQ(load_be32(none->parameters, 24), 0U);

  parameters.transport_ids = {sas_transport_id(1), fc_transport_id(2), sas_transport_id(3)};
  const auto three = encode_prout(PrOutAction::kRegister, std::nullopt, parameters);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(three->parameters.size(), 28U + 3 * 24);
  EXPECT_EQ(load_be32(three->parameters, 24), 72U);
  EXPECT_EQ(load_be32(three->cdb, 5), 100U);
  EXPECT_EQ(load_be64(three->parameters, 28 + 24 + 8), 2U) << "FC N_Port name at TID byte 8";
}

TEST(ProutRegisterAndMove, MatchesSgPersist) {
  RegisterAndMoveParameters parameters;
  parameters.key = kKeyB;
  parameters.sa_key = kKeyA;
  parameters.unreg = true;
  parameters.aptpl = true;
  parameters.relative_target_port_id = 2;
  parameters.transport_id = fc_transport_id(0x10000000c9f3a571ULL);
  const auto command = encode_prout_register_and_move(parameters);
  ASSERT_TRUE(command.has_value()) << command.error().message();
  EXPECT_EQ(cdb_bytes(command->cdb), hex("5f 07 00 00 00 00 00 00 30 00"));
  EXPECT_EQ(command->parameters, hex("4c 49 4f 00 00 00 00 02 4c 49 4f 00 00 00 00 01"
                                     " 00 03 00 02 00 00 00 18"
                                     " 00×8 10 00 00 00 c9 f3 a5 71 00×8"));
  // LIO: TRANSPORTID PARAMETER DATA LENGTH + 24 must equal the parameter list length exactly.
  EXPECT_EQ(load_be32(command->parameters, 20) + 24, load_be32(command->cdb, 5));
}

TEST(ProutRegisterAndMove, RefusesATransportIdItCannotEncode) {
  RegisterAndMoveParameters parameters;
  parameters.transport_id.protocol = ProtocolId::kSrp;
  EXPECT_EQ(encode_prout_register_and_move(parameters).error().code(), ErrorCode::kNotSupported);
}

TEST(ProutRejects, CombinationsSpcRefuses) {
  PrOutParameters parameters;
  parameters.key = kKeyA;
  const auto expect_invalid = [](const Result<PrOutCommand>& command, const char* what) {
    ASSERT_FALSE(command.has_value()) << what;
    EXPECT_EQ(command.error().code(), ErrorCode::kInvalidArgument) << what;
  };
  expect_invalid(encode_prout(PrOutAction::kRegisterAndMove, std::nullopt, parameters),
                 "REGISTER AND MOVE through the basic list");
  for (const PrOutAction action : {PrOutAction::kReserve, PrOutAction::kRelease,
                                   PrOutAction::kPreempt, PrOutAction::kPreemptAndAbort}) {
    expect_invalid(encode_prout(action, std::nullopt, parameters), "no type");
  }
  parameters.spec_i_pt = true;
  expect_invalid(encode_prout(PrOutAction::kRegisterAndIgnoreExistingKey, std::nullopt, parameters),
                 "SPEC_I_PT with REGISTER AND IGNORE EXISTING KEY");
  parameters.spec_i_pt = false;
  parameters.transport_ids = {sas_transport_id(1)};
  expect_invalid(encode_prout(PrOutAction::kRegister, std::nullopt, parameters),
                 "TransportIDs without SPEC_I_PT");
  parameters.spec_i_pt = true;
  parameters.transport_ids = {iscsi_transport_id("")};
  expect_invalid(encode_prout(PrOutAction::kRegister, std::nullopt, parameters),
                 "an empty iSCSI name");
}

// Types are ignored by REGISTER*, CLEAR: the CDB carries them if given, as sg_persist -T does.
TEST(ProutCdb, IgnoredTypeIsStillEncodedWhenGiven) {
  PrOutParameters parameters;
  parameters.key = kKeyA;
  const auto command = encode_prout(PrOutAction::kClear, PrType::kExclusiveAccess, parameters);
  ASSERT_TRUE(command.has_value());
  EXPECT_EQ(command->cdb[2], 0x03);
}

}  // namespace
}  // namespace blkfence::codec

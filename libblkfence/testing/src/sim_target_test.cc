// Proves that SimTarget answers everything but PERSISTENT RESERVE OUT as LIO does
// (docs/reference/lio.md; sim_target_prout_test.cc has PR OUT): which nexus may write and read
// under each of the six types; a unit attention reported once, the highest first, all cleared,
// and the command that got it not executed; the PR IN layouts and LIO's truncation quirks; and
// INQUIRY VPD pages. Time is simulated: nothing sleeps.
#include "sim_target_test_bench.h"

namespace blkfence::transport::test {
namespace {

// --- Who may write and read (lio.md §3, core_scsi3_pr_seq_non_holder) ---

struct AccessCase {
  PrType type;
  bool registrant_writes;
  bool stranger_reads;
  bool registrant_reads;
};

class SimTargetAccess : public SimTargetTest, public ::testing::WithParamInterface<AccessCase> {};

TEST_P(SimTargetAccess, WritesAndReadsFollowTheType) {
  const AccessCase access = GetParam();
  set_up_holder(access.type);
  const auto writes = [this](NexusId nexus, std::uint8_t fill) {
    const SimAnswer narrow = run(nexus, write_command(10, fill));
    const SimAnswer wide = run(nexus, write_command(11, fill, 1, true));
    EXPECT_EQ(narrow.status, wide.status);
    if (is_good(narrow)) {
      EXPECT_EQ(target.block(lu, 10), std::vector<std::uint8_t>(512, fill));
      return true;
    }
    EXPECT_TRUE(is_conflict(narrow));
    EXPECT_NE(target.block(lu, 10), std::vector<std::uint8_t>(512, fill));
    return false;
  };
  const auto reads = [this](NexusId nexus) {
    const SimAnswer answer = run(nexus, read_command(10, 1, nexus % 2 == 0));
    EXPECT_TRUE(is_good(answer) || is_conflict(answer));
    return is_good(answer);
  };
  EXPECT_TRUE(writes(kA1, 0x11));                          // the holder
  EXPECT_EQ(writes(kA2, 0x22), access.registrant_writes);  // the holder's other path
  EXPECT_EQ(writes(kB, 0x33), access.registrant_writes);   // another registrant
  EXPECT_FALSE(writes(kStranger, 0x44));                   // unregistered
  EXPECT_TRUE(reads(kA1));
  EXPECT_EQ(reads(kB), access.registrant_reads);
  EXPECT_EQ(reads(kStranger), access.stranger_reads);
  // Test unit ready and PR IN are allowed for everyone (explicitly, in LIO's table).
  EXPECT_TRUE(is_good(run(kStranger, test_unit_ready_command())));
  for (const WriteRecord& write : target.history().writes) {
    EXPECT_EQ(write.landed, write.outcome.status == kGood);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllSixTypes, SimTargetAccess,
    ::testing::Values(AccessCase{PrType::kWriteExclusive, false, true, true},
                      AccessCase{PrType::kExclusiveAccess, false, false, false},
                      AccessCase{PrType::kWriteExclusiveRegistrantsOnly, true, true, true},
                      AccessCase{PrType::kExclusiveAccessRegistrantsOnly, true, false, true},
                      AccessCase{PrType::kWriteExclusiveAllRegistrants, true, true, true},
                      AccessCase{PrType::kExclusiveAccessAllRegistrants, true, false, true}),
    [](const ::testing::TestParamInfo<AccessCase>& param_info) {
      return "Type" + std::to_string(static_cast<int>(param_info.param.type));
    });

TEST_F(SimTargetTest, WithoutAReservationAnyNexusWrites) {
  ASSERT_TRUE(is_good(register_key(kA1, kKeyA)));
  EXPECT_TRUE(is_good(run(kStranger, write_command(0, 0x5a))));
  EXPECT_EQ(target.block(lu, 0), std::vector<std::uint8_t>(512, 0x5a));
}

// --- Unit attentions (lio.md §5) ---

TEST_F(SimTargetTest, AUnitAttentionIsReportedOnceAndItsCommandDoesNotExecute) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  ASSERT_TRUE(is_good(prout(
      kB, codec::prout_preempt_and_abort(kKeyB, kKeyA, PrType::kWriteExclusiveRegistrantsOnly))));
  const std::uint32_t before = generation();
  // A1 re-registers: the REGISTER gets the UA and does not happen (docs/design.md §7).
  EXPECT_TRUE(is_unit_attention(register_key(kA1, kKeyA), kUaRegistrationsPreempted));
  EXPECT_EQ(keys(), (std::vector<std::uint64_t>{kKeyB, kKeyC}));
  EXPECT_EQ(generation(), before);
  EXPECT_TRUE(is_good(register_key(kA1, kKeyA)));
  EXPECT_EQ(generation(), before + 1);
  // A2's write gets the UA, so it is neither refused by the reservation nor executed.
  EXPECT_TRUE(is_unit_attention(run(kA2, write_command(3, 0x77)), kUaRegistrationsPreempted));
  EXPECT_EQ(target.block(lu, 3), std::nullopt);
  EXPECT_TRUE(is_conflict(run(kA2, write_command(3, 0x77))));
}

TEST_F(SimTargetTest, OnlyTheHighestUnitAttentionIsReportedAndAllAreCleared) {
  target.add_unit_attention(lu, kA1, kUaRegistrationsPreempted);
  target.add_unit_attention(lu, kA1, kUaReservationsReleased);
  target.nexus_loss(kA1);
  // LIO compares a new UA with the head only, so this duplicate is queued again.
  target.add_unit_attention(lu, kA1, kUaRegistrationsPreempted);
  EXPECT_EQ(target.unit_attentions(lu, kA1),
            (std::vector<UnitAttention>{kUaItNexusLoss, kUaRegistrationsPreempted,
                                        kUaReservationsReleased, kUaRegistrationsPreempted}));
  EXPECT_TRUE(is_unit_attention(run(kA1, test_unit_ready_command()), kUaItNexusLoss));
  EXPECT_TRUE(target.unit_attentions(lu, kA1).empty());
  EXPECT_TRUE(is_good(run(kA1, test_unit_ready_command())));
}

TEST_F(SimTargetTest, InquiryReportLunsAndRequestSenseAreExempt) {
  target.add_unit_attention(lu, kA1, kUaReservationsPreempted);
  EXPECT_TRUE(is_good(run(kA1, inquiry_command(std::nullopt))));
  const SimAnswer luns = run(kA1, report_luns_command());
  ASSERT_TRUE(is_good(luns));
  EXPECT_EQ(luns.data_in.size(), 16U);
  EXPECT_EQ(target.unit_attentions(lu, kA1).size(), 1U);
  // REQUEST SENSE returns the UA as its data and clears it.
  const SimAnswer sense = run(kA1, request_sense_command());
  ASSERT_TRUE(is_good(sense));
  const codec::Sense decoded = codec::decode_sense(sense.data_in);
  EXPECT_EQ(decoded.sense_key, SenseKey::kUnitAttention);
  EXPECT_EQ(decoded.asc, 0x2a);
  EXPECT_EQ(decoded.ascq, 0x03);
  EXPECT_TRUE(is_good(run(kA1, test_unit_ready_command())));
  EXPECT_EQ(codec::decode_sense(run(kA1, request_sense_command()).data_in).sense_key,
            SenseKey::kNoSense);
}

TEST_F(SimTargetTest, CdbErrorsComeBeforeTheUnitAttention) {
  target.nexus_loss(kA1);
  Command unknown = Command::from_cdb(std::vector<std::uint8_t>{0xd7, 0, 0, 0, 0, 0});
  EXPECT_TRUE(is_sense(run(kA1, unknown), SenseKey::kIllegalRequest, 0x20, 0x00));
  EXPECT_TRUE(is_sense(run(kA1, write_command(2048, 0x01)), SenseKey::kIllegalRequest, 0x21, 0x00));
  EXPECT_TRUE(is_sense(run(kA1, read_command(2047, 2)), SenseKey::kIllegalRequest, 0x21, 0x00));
  EXPECT_EQ(target.unit_attentions(lu, kA1), std::vector<UnitAttention>{kUaItNexusLoss});
}

// --- PR IN (spc4-pr.md §5, lio.md §1) ---

TEST_F(SimTargetTest, ReadKeysCountsEveryKeyButCopiesOnlyWholeOnesThatFit) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  const SimAnswer answer = run(kObserver, prin_command(PrInAction::kReadKeys, 21));
  ASSERT_TRUE(is_good(answer));
  ASSERT_EQ(answer.data_in.size(), 21U);
  EXPECT_EQ(load_be32(answer.data_in, 4), 32U);
  EXPECT_EQ(std::vector<std::uint8_t>(answer.data_in.begin() + 16, answer.data_in.end()),
            std::vector<std::uint8_t>(5, 0));
  const auto decoded = codec::decode_read_keys(answer.data_in);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(decoded->keys, std::vector<std::uint64_t>{kKeyA});
  EXPECT_TRUE(decoded->truncated);
  EXPECT_TRUE(is_sense(run(kObserver, prin_command(PrInAction::kReadKeys, 7)),
                       SenseKey::kIllegalRequest, 0x24, 0x00));
  Command unknown = prin_command(PrInAction::kReadKeys);
  unknown.cdb[1] = 0x04;
  EXPECT_TRUE(is_sense(run(kObserver, unknown), SenseKey::kIllegalRequest, 0x24, 0x00));
}

TEST_F(SimTargetTest, ReadReservationBelow22BytesHasNeitherKeyNorType) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  const SimAnswer answer = run(kObserver, prin_command(PrInAction::kReadReservation, 16));
  ASSERT_TRUE(is_good(answer));
  EXPECT_EQ(answer.data_in.size(), 16U);
  EXPECT_EQ(load_be32(answer.data_in, 4), 16U);
  EXPECT_EQ(load_be64(answer.data_in, 8), 0U);
  const auto decoded = codec::decode_read_reservation(answer.data_in);
  ASSERT_TRUE(decoded.has_value());
  EXPECT_TRUE(decoded->truncated);
  EXPECT_EQ(decoded->reservation, std::nullopt);
}

TEST_F(SimTargetTest, ReportCapabilitiesAsLio) {
  Command command = prin_command(PrInAction::kReportCapabilities, 8);
  auto caps = codec::decode_report_capabilities(run(kObserver, command).data_in);
  ASSERT_TRUE(caps.has_value());
  EXPECT_TRUE(caps->crh && caps->sip_c && caps->atp_c && caps->ptpl_c && caps->tmv);
  EXPECT_FALSE(caps->rlr_c);
  EXPECT_EQ(caps->allow_commands, 1);
  EXPECT_FALSE(caps->ptpl_a);
  for (const PrType type : kAllTypes) {
    EXPECT_TRUE(caps->supports(type)) << codec::to_string(type);
  }
  ASSERT_TRUE(is_good(
      prout(kA1, codec::prout_register_and_ignore(kKeyA, {.all_tg_pt = false, .aptpl = true}))));
  caps = codec::decode_report_capabilities(run(kObserver, command).data_in);
  ASSERT_TRUE(caps.has_value());
  EXPECT_TRUE(caps->ptpl_a);
  EXPECT_TRUE(is_sense(run(kObserver, prin_command(PrInAction::kReportCapabilities, 5)),
                       SenseKey::kIllegalRequest, 0x24, 0x00));
}

TEST_F(SimTargetTest, ReadFullStatusDescribesEveryRegistration) {
  set_up_holder(PrType::kWriteExclusiveRegistrantsOnly);
  auto status = codec::decode_read_full_status(
      run(kObserver, prin_command(PrInAction::kReadFullStatus)).data_in);
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(status->descriptors.size(), 4U);
  EXPECT_FALSE(status->truncated);
  const NexusId nexuses[] = {kA1, kA2, kB, kC};
  for (std::size_t i = 0; i < 4; ++i) {
    const codec::FullStatusDescriptor& descriptor = status->descriptors[i];
    EXPECT_EQ(descriptor.holder, i == 0);
    EXPECT_EQ(descriptor.relative_target_port_id, SimTarget::kRelativeTargetPortId);
    EXPECT_EQ(descriptor.transport_id, SimTarget::initiator_port(nexuses[i]));
  }
  EXPECT_EQ(status->descriptors[0].type, PrType::kWriteExclusiveRegistrantsOnly);
  // Under an AR type every registrant is a holder (B and C are left).
  ASSERT_TRUE(is_good(
      prout(kB, codec::prout_preempt(kKeyB, kKeyA, PrType::kWriteExclusiveAllRegistrants))));
  status = codec::decode_read_full_status(
      run(kObserver, prin_command(PrInAction::kReadFullStatus)).data_in);
  ASSERT_TRUE(status.has_value());
  ASSERT_EQ(status->descriptors.size(), 2U);
  for (const codec::FullStatusDescriptor& descriptor : status->descriptors) {
    EXPECT_TRUE(descriptor.holder);
    EXPECT_EQ(descriptor.type, PrType::kWriteExclusiveAllRegistrants);
  }
  // LIO's fit check counts only the 24-byte TransportID: at 60 bytes the second descriptor is
  // dropped and not counted, so nothing looks truncated; at 80 it is counted and then cut.
  status = codec::decode_read_full_status(
      run(kObserver, prin_command(PrInAction::kReadFullStatus, 60)).data_in);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->additional_length, 48U);
  EXPECT_EQ(status->descriptors.size(), 1U);
  EXPECT_FALSE(status->truncated);
  const SimAnswer cut = run(kObserver, prin_command(PrInAction::kReadFullStatus, 80));
  EXPECT_EQ(cut.data_in.size(), 80U);
  status = codec::decode_read_full_status(cut.data_in);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->additional_length, 96U);
  EXPECT_EQ(status->descriptors.size(), 1U);
  EXPECT_TRUE(status->truncated);
}

// --- INQUIRY ---

TEST_F(SimTargetTest, InquiryGivesSerialAndNaaDesignator) {
  const auto serial = codec::decode_vpd_unit_serial(
      run(kA1, inquiry_command(codec::VpdPage::kUnitSerialNumber)).data_in);
  ASSERT_TRUE(serial.has_value());
  EXPECT_EQ(serial->serial, "sim-lu-0");
  const auto identification = codec::decode_vpd_device_identification(
      run(kA1, inquiry_command(codec::VpdPage::kDeviceIdentification)).data_in);
  ASSERT_TRUE(identification.has_value());
  EXPECT_FALSE(identification->truncated);
  EXPECT_EQ(codec::lu_wwn(*identification), "naa.60014050000000000000000000000000");
  const LuId second = target.add_lu({.serial = "abc",
                                     .naa = {0x60, 0x01, 0x40, 0x5a, 0xbc},
                                     .product = "X",
                                     .block_size = 4096,
                                     .block_count = 16,
                                     .aptpl_file_writable = true});
  const auto other = codec::decode_vpd_device_identification(
      target.execute(second, kA1, inquiry_command(codec::VpdPage::kDeviceIdentification)).data_in);
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(codec::lu_wwn(*other), "naa.6001405abc0000000000000000000000");
  const SimAnswer standard = run(kA1, inquiry_command(std::nullopt, 36));
  ASSERT_TRUE(is_good(standard));
  EXPECT_EQ(std::string(standard.data_in.begin() + 8, standard.data_in.begin() + 16), "LIO-ORG ");
  Command evpd_zero_with_page = inquiry_command(std::nullopt);
  evpd_zero_with_page.cdb[2] = 0x80;
  EXPECT_TRUE(is_sense(run(kA1, evpd_zero_with_page), SenseKey::kIllegalRequest, 0x24, 0x00));
  Command unknown_page = inquiry_command(codec::VpdPage::kSupportedPages);
  unknown_page.cdb[2] = 0xb0;
  EXPECT_TRUE(is_sense(run(kA1, unknown_page), SenseKey::kIllegalRequest, 0x24, 0x00));
}

}  // namespace
}  // namespace blkfence::transport::test

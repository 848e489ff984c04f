// Proves the one mapping from what sg reports to an Outcome: every SAM status, every Linux host
// code that can come back (and an unknown one), the old driver byte, and errno; that a host code
// outranks the status byte; that the sg request header carries what sg needs; that lengths the
// kernel reports are clamped to the request's buffers; and that commands sg would refuse are
// refused at submit().
#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "sg.h"

namespace blkfence::transport::detail {
namespace {

Outcome of_status(std::uint8_t status) {
  return classify(SgAnswer{.status = status});
}
Outcome of_host(std::uint16_t host_status, std::uint8_t status = 0) {
  return classify(SgAnswer{.status = status, .host_status = host_status});
}

TEST(Outcome, NamesEveryOutcomeDistinctly) {
  const Outcome all[] = {Outcome::kGood,    Outcome::kCheckCondition, Outcome::kReservationConflict,
                         Outcome::kBusy,    Outcome::kTaskAborted,    Outcome::kTransportError,
                         Outcome::kOsError, Outcome::kIndeterminate};
  std::set<std::string_view> names;
  for (const Outcome outcome : all) {
    EXPECT_NE(to_string(outcome), "unknown outcome");
    names.insert(to_string(outcome));
  }
  EXPECT_EQ(names.size(), std::size(all));
  EXPECT_EQ(to_string(Outcome::kReservationConflict), "RESERVATION CONFLICT");
}

TEST(Outcome, CommandFromCdbCopiesBytesAndSize) {
  const std::uint8_t prout[10] = {0x5f, 0x06, 0x05, 0, 0, 0, 0, 0, 0x18, 0};
  const Command command = Command::from_cdb(prout);
  EXPECT_EQ(command.cdb_size, 10);
  EXPECT_TRUE(std::equal(prout, prout + 10, command.cdb.begin()));
  EXPECT_EQ(command.cdb[10], 0);
  const std::uint8_t sixteen[16] = {0x9e, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  EXPECT_EQ(Command::from_cdb(sixteen).cdb_size, 16);
  EXPECT_EQ(Command::from_cdb(sixteen).cdb[15], 15);
}

TEST(OutcomeDeathTest, CommandFromCdbRefusesMoreThanSixteenBytes) {
  const std::uint8_t too_long[17] = {};
  EXPECT_DEATH((void)Command::from_cdb(too_long), "assertion failed");
}

TEST(Classify, EverySamStatus) {
  EXPECT_EQ(of_status(0x00), Outcome::kGood);
  EXPECT_EQ(of_status(0x02), Outcome::kCheckCondition);
  EXPECT_EQ(of_status(0x04), Outcome::kGood);  // CONDITION MET
  EXPECT_EQ(of_status(0x08), Outcome::kBusy);
  EXPECT_EQ(of_status(0x18), Outcome::kReservationConflict);
  EXPECT_EQ(of_status(0x28), Outcome::kBusy);  // TASK SET FULL
  EXPECT_EQ(of_status(0x30), Outcome::kBusy);  // ACA ACTIVE
  EXPECT_EQ(of_status(0x40), Outcome::kTaskAborted);
  // Obsolete INTERMEDIATE, COMMAND TERMINATED, and reserved codes: unreadable answers.
  for (const std::uint8_t status :
       std::initializer_list<std::uint8_t>{0x10, 0x14, 0x22, 0x01, 0x0c, 0xff}) {
    EXPECT_EQ(of_status(status), Outcome::kIndeterminate) << int{status};
  }
}

TEST(Classify, HostCodesThatNeverReachedTheLuAreTransportErrors) {
  for (const std::uint16_t host :
       std::initializer_list<std::uint16_t>{0x01, 0x02, 0x04, 0x0c, 0x0d, 0x0f, 0x14}) {
    EXPECT_EQ(of_host(host), Outcome::kTransportError) << host;
    EXPECT_EQ(of_host(host, 0x18), Outcome::kTransportError) << "host outranks status " << host;
  }
}

TEST(Classify, HostCodesWithTheCommandPossiblyExecutedAreIndeterminate) {
  // DID_TIME_OUT is what sg reports for a command the midlayer timed out (scsi_error.c:
  // scsi_timeout() and scmd_eh_abort_handler() set it); it may have run on the target.
  EXPECT_EQ(of_host(0x03), Outcome::kIndeterminate);
  EXPECT_EQ(of_host(0x03, 0x00), Outcome::kIndeterminate) << "GOOD status does not outrank it";
  for (const std::uint16_t host :
       std::initializer_list<std::uint16_t>{0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0e}) {
    EXPECT_EQ(of_host(host), Outcome::kIndeterminate) << host;
  }
  EXPECT_EQ(of_host(0x15), Outcome::kIndeterminate) << "a code newer than the table";
  EXPECT_EQ(of_host(0xffff), Outcome::kIndeterminate);
}

TEST(Classify, HostCodesOfAnAnswerDeferToTheStatus) {
  EXPECT_EQ(of_host(0x00, 0x18), Outcome::kReservationConflict);
  EXPECT_EQ(of_host(0x10, 0x02), Outcome::kCheckCondition);  // DID_TARGET_FAILURE
  EXPECT_EQ(of_host(0x12, 0x02), Outcome::kCheckCondition);  // DID_ALLOC_FAILURE
  EXPECT_EQ(of_host(0x13, 0x02), Outcome::kCheckCondition);  // DID_MEDIUM_ERROR
  // DID_NEXUS_FAILURE: the midlayer's mark for RESERVATION CONFLICT, should it leak through.
  EXPECT_EQ(of_host(0x11, 0x00), Outcome::kReservationConflict);
}

TEST(Classify, DriverByte) {
  // DRIVER_SENSE (0x08) just says sense was copied: sg 6.1 sets it with CHECK CONDITION.
  EXPECT_EQ(classify(SgAnswer{.status = 0x02, .driver_status = 0x08}), Outcome::kCheckCondition);
  EXPECT_EQ(classify(SgAnswer{.status = 0x00, .driver_status = 0x08}), Outcome::kGood);
  // DRIVER_TIMEOUT of kernels before 5.14, alone or with DRIVER_SENSE and suggestion bits.
  EXPECT_EQ(classify(SgAnswer{.driver_status = 0x06}), Outcome::kIndeterminate);
  EXPECT_EQ(classify(SgAnswer{.driver_status = 0x0e}), Outcome::kIndeterminate);
  EXPECT_EQ(classify(SgAnswer{.driver_status = 0x26}), Outcome::kIndeterminate);
  for (const std::uint16_t driver :
       std::initializer_list<std::uint16_t>{0x01, 0x02, 0x03, 0x04, 0x05, 0x07}) {
    EXPECT_EQ(classify(SgAnswer{.driver_status = driver}), Outcome::kIndeterminate) << driver;
  }
  EXPECT_EQ(classify(SgAnswer{.status = 0x18, .driver_status = 0x10}),
            Outcome::kReservationConflict)
      << "suggestion bits alone are not an error";
}

TEST(Classify, ErrnoIsAnOsErrorUnlessTheCommandMayHaveRun) {
  EXPECT_EQ(classify(SgAnswer{.os_errno = EPERM}), Outcome::kOsError);
  EXPECT_EQ(classify(SgAnswer{.os_errno = EDOM}), Outcome::kOsError);
  EXPECT_EQ(classify(SgAnswer{.os_errno = ENODEV, .may_have_executed = true}),
            Outcome::kIndeterminate);
  EXPECT_EQ(classify(SgAnswer{.os_errno = EIO, .status = 0x00}), Outcome::kOsError)
      << "an errno outranks whatever the header says";
}

Command read_keys(std::uint32_t data_in_size) {
  const std::uint8_t cdb[10] = {0x5e, 0x00, 0, 0, 0, 0, 0, 0x00, 0x10, 0};
  Command command = Command::from_cdb(cdb);
  command.direction = DataDirection::kFromDevice;
  command.data_in_size = data_in_size;
  command.timeout = std::chrono::milliseconds(2500);
  command.tag = 77;
  return command;
}

TEST(SgRequest, HeaderCarriesWhatSgNeeds) {
  SgRequest request(read_keys(16), 4242, Clock::now());
  const sg_io_hdr& header = request.header();
  EXPECT_EQ(header.interface_id, 'S');
  EXPECT_EQ(header.dxfer_direction, SG_DXFER_FROM_DEV);
  EXPECT_EQ(header.cmd_len, 10);
  EXPECT_EQ(header.cmdp[0], 0x5e);
  EXPECT_EQ(header.mx_sb_len, kSenseSizeMax);
  EXPECT_NE(header.sbp, nullptr);
  EXPECT_EQ(header.dxfer_len, 16U);
  EXPECT_NE(header.dxferp, nullptr);
  EXPECT_EQ(header.timeout, 2500U);  // milliseconds, as sg takes them
  EXPECT_EQ(header.pack_id, 4242);
  EXPECT_EQ(header.iovec_count, 0);
  EXPECT_EQ(header.flags, 0U);

  Command prout = Command::from_cdb(std::vector<std::uint8_t>{0x5f, 0, 0, 0, 0, 0, 0, 0, 24, 0});
  prout.direction = DataDirection::kToDevice;
  prout.data_out.assign(24, 0xab);
  SgRequest out(std::move(prout), 1, Clock::now());
  EXPECT_EQ(out.header().dxfer_direction, SG_DXFER_TO_DEV);
  EXPECT_EQ(out.header().dxfer_len, 24U);
  EXPECT_EQ(static_cast<const std::uint8_t*>(out.header().dxferp)[23], 0xab);

  Command none = Command::from_cdb(std::vector<std::uint8_t>{0x00, 0, 0, 0, 0, 0});
  SgRequest tur(std::move(none), 2, Clock::now());
  EXPECT_EQ(tur.header().dxfer_direction, SG_DXFER_NONE);
  EXPECT_EQ(tur.header().dxfer_len, 0U);
}

TEST(SgRequest, AnswerLengthsAreClampedToTheBuffers) {
  SgRequest request(read_keys(16), 1, Clock::now());
  sg_io_hdr& header = request.header();
  std::fill_n(static_cast<std::uint8_t*>(header.dxferp), 16, 0x11);
  std::fill_n(header.sbp, kSenseSizeMax, 0x22);

  sg_io_hdr answer = header;
  answer.status = 0x02;
  answer.driver_status = 0x08;
  answer.sb_len_wr = 255;  // more than the buffer
  answer.resid = -5;       // negative
  Completion completion = request.answered(answer, Clock::now());
  EXPECT_EQ(completion.tag, 77U);
  EXPECT_EQ(completion.outcome, Outcome::kCheckCondition);
  EXPECT_EQ(completion.status, 0x02);
  EXPECT_EQ(completion.driver_status, 0x08);
  EXPECT_EQ(completion.sense.size(), kSenseSizeMax);
  EXPECT_EQ(completion.data_in.size(), 16U);

  answer.status = 0;
  answer.driver_status = 0;
  answer.sb_len_wr = 0;
  answer.resid = 6;
  completion = request.answered(answer, Clock::now());
  EXPECT_EQ(completion.outcome, Outcome::kGood);
  EXPECT_TRUE(completion.sense.empty());
  EXPECT_EQ(completion.data_in, std::vector<std::uint8_t>(10, 0x11));

  answer.resid = 1000;  // more than was asked for
  EXPECT_TRUE(request.answered(answer, Clock::now()).data_in.empty());
}

TEST(SgRequest, UnansweredKeepsTheTagAndErrno) {
  SgRequest request(read_keys(8), 1, Clock::now());
  const Completion completion = request.unanswered(Outcome::kOsError, ECANCELED, Clock::now());
  EXPECT_EQ(completion.tag, 77U);
  EXPECT_EQ(completion.outcome, Outcome::kOsError);
  EXPECT_EQ(completion.os_errno, ECANCELED);
  EXPECT_TRUE(completion.data_in.empty());
}

TEST(CheckCommand, RefusesWhatSgWouldRefuse) {
  EXPECT_TRUE(check_command(read_keys(16)).has_value());

  Command short_cdb = read_keys(16);
  short_cdb.cdb_size = 5;
  EXPECT_EQ(check_command(short_cdb).error().code(), ErrorCode::kInvalidArgument);
  short_cdb.cdb_size = 0;
  EXPECT_FALSE(check_command(short_cdb).has_value());
  Command long_cdb = read_keys(16);
  long_cdb.cdb_size = 17;
  EXPECT_FALSE(check_command(long_cdb).has_value());

  Command no_buffer = read_keys(0);
  EXPECT_FALSE(check_command(no_buffer).has_value());
  Command both = read_keys(16);
  both.data_out = {1};
  EXPECT_FALSE(check_command(both).has_value());
  Command none_with_data = read_keys(16);
  none_with_data.direction = DataDirection::kNone;
  EXPECT_FALSE(check_command(none_with_data).has_value());
  Command out_without_data = read_keys(0);
  out_without_data.direction = DataDirection::kToDevice;
  EXPECT_FALSE(check_command(out_without_data).has_value());

  EXPECT_TRUE(check_command(read_keys(kDataSizeMax)).has_value());
  EXPECT_FALSE(check_command(read_keys(kDataSizeMax + 1)).has_value());

  Command zero_timeout = read_keys(16);
  zero_timeout.timeout = std::chrono::milliseconds(0);
  const auto refused = check_command(zero_timeout);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().where().find("tag 77"), std::string::npos);
  Command huge_timeout = read_keys(16);
  huge_timeout.timeout = kTimeoutMax + std::chrono::milliseconds(1);
  EXPECT_FALSE(check_command(huge_timeout).has_value());
}

}  // namespace
}  // namespace blkfence::transport::detail

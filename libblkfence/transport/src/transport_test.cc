// Proves make_transport() picks io_uring when the kernel allows it and SG_IO on request, and that
// run_batch() returns completions in submission order with the callers' tags although they finish
// in another order, refuses a transport that has other commands in flight, and reports a failed
// submit only after reaping what it had already submitted; and that both transports name the device
// node a path's fd is on.
#include <map>
#include <thread>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>

#include "blkfence/testing/fake_sg.h"

#include "transport_impl.h"

namespace blkfence::transport::test {
namespace {

using std::chrono::milliseconds;

TEST(MakeTransport, AutoPrefersIoUring) {
  const auto uring = make_transport(TransportKind::kUring);
  const auto automatic = make_transport(TransportKind::kAuto);
  ASSERT_TRUE(automatic.has_value()) << automatic.error().message();
  if (uring) {
    EXPECT_EQ((*automatic)->name(), "io_uring");
  } else {
    EXPECT_EQ(uring.error().code(), ErrorCode::kNotSupported) << uring.error().message();
    EXPECT_EQ((*automatic)->name(), "sg_io");
  }
  const auto sgio = make_transport(TransportKind::kSgio);
  ASSERT_TRUE(sgio.has_value());
  EXPECT_EQ((*sgio)->name(), "sg_io");
}

// Both transports say which device node a path's fd is on (a character device here, /dev/null:
// 1:3), and nothing for a closed path.
TEST(DeviceOf, NamesTheNodeThePathsFdIsOn) {
  std::vector<std::unique_ptr<detail::TransportImpl>> transports;
  if (auto uring = detail::make_uring_transport({})) {
    transports.push_back(std::move(*uring));
  }
  transports.push_back(detail::make_sgio_transport({}).value());
  for (const auto& transport : transports) {
    const PathId path =
        transport->open_path_fd(UniqueFd(::open("/dev/null", O_RDWR | O_CLOEXEC)), "null").value();
    const auto node = transport->device_of(path);
    ASSERT_TRUE(node.has_value()) << transport->name();
    EXPECT_TRUE(node->is_char);
    EXPECT_EQ(node->major, 1U);
    EXPECT_EQ(node->minor, 3U);
    transport->close_path(path);
    EXPECT_FALSE(transport->device_of(path).has_value()) << transport->name();
  }
}

TEST(RunBatch, ReturnsSubmissionOrderWhateverTheCompletionOrder) {
  auto fake = std::make_shared<FakeSgIo>([](const FakeRequest&) { return std::nullopt; });
  detail::SgioOptions options;
  options.threads = 4;
  options.per_path_max = 4;  // all four at once in the device, on one path
  options.sg_io = [fake](int fd, sg_io_hdr& header) { return (*fake)(fd, header); };
  auto transport = detail::make_sgio_transport(options);
  ASSERT_TRUE(transport.has_value());
  const PathId path =
      (*transport)->open_path_fd(UniqueFd(::eventfd(0, EFD_CLOEXEC)), "fake").value();

  // The device finishes the four commands newest first.
  std::thread device([&fake] {
    if (!fake->wait_blocked(4)) {
      return;
    }
    std::map<std::int32_t, std::uint32_t> marker_of_pack;
    for (const FakeRequest& request : fake->received()) {
      marker_of_pack[request.pack_id] = marker_of(request);
    }
    const auto blocked = fake->blocked();
    for (auto it = blocked.rbegin(); it != blocked.rend(); ++it) {
      FakeReply reply;
      reply.data_in = {static_cast<std::uint8_t>(marker_of_pack[*it])};
      fake->release(*it, reply);
      fake->wait_returned(static_cast<std::size_t>(it - blocked.rbegin()) + 1);
    }
  });
  std::vector<PathCommand> batch;
  for (std::uint32_t marker = 0; marker < 4; ++marker) {
    // Callers' tags need not be unique or ordered: the batch keeps them apart by position.
    batch.push_back({path, marked_command(marker, 7, milliseconds(10'000))});
  }
  const auto completions = run_batch(**transport, std::move(batch));
  device.join();
  ASSERT_TRUE(completions.has_value()) << completions.error().message();
  ASSERT_EQ(completions->size(), 4U);
  for (std::uint8_t i = 0; i < 4; ++i) {
    EXPECT_EQ((*completions)[i].tag, 7U);
    EXPECT_EQ((*completions)[i].data_in, std::vector<std::uint8_t>{i});
  }
}

TEST(RunBatch, RefusesATransportWithCommandsInFlight) {
  auto fake = std::make_shared<FakeSgIo>([](const FakeRequest&) { return FakeReply{}; });
  detail::SgioOptions options;
  options.threads = 1;
  options.sg_io = [fake](int fd, sg_io_hdr& header) { return (*fake)(fd, header); };
  auto transport = detail::make_sgio_transport(options);
  ASSERT_TRUE(transport.has_value());
  const PathId path =
      (*transport)->open_path_fd(UniqueFd(::eventfd(0, EFD_CLOEXEC)), "fake").value();
  ASSERT_TRUE((*transport)->submit(path, marked_command(1, 1, milliseconds(10'000))).has_value());
  std::vector<PathCommand> batch;
  batch.push_back({path, marked_command(2, 2, milliseconds(10'000))});
  const auto refused = run_batch(**transport, std::move(batch));
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(reap_count(**transport, 1).size(), 1U);  // the earlier command is still its caller's
}

TEST(RunBatch, ReportsAFailedSubmitAfterReapingTheRest) {
  auto fake = std::make_shared<FakeSgIo>([](const FakeRequest&) { return FakeReply{}; });
  detail::SgioOptions options;
  options.threads = 2;
  options.sg_io = [fake](int fd, sg_io_hdr& header) { return (*fake)(fd, header); };
  auto transport = detail::make_sgio_transport(options);
  ASSERT_TRUE(transport.has_value());
  const PathId path =
      (*transport)->open_path_fd(UniqueFd(::eventfd(0, EFD_CLOEXEC)), "fake").value();
  std::vector<PathCommand> batch;
  batch.push_back({path, marked_command(0, 0, milliseconds(10'000))});
  batch.push_back({path + 1, marked_command(1, 1, milliseconds(10'000))});  // no such path
  batch.push_back({path, marked_command(2, 2, milliseconds(10'000))});
  const auto failed = run_batch(**transport, std::move(batch));
  ASSERT_FALSE(failed.has_value());
  EXPECT_EQ(failed.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(failed.error().where().find("command 1 of the batch"), std::string::npos);
  EXPECT_EQ((*transport)->in_flight(), 0U);
  EXPECT_EQ(fake->received().size(), 1U) << "commands after the failed one were submitted";
}

}  // namespace
}  // namespace blkfence::transport::test

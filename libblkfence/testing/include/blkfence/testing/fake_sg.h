// Fake sg devices for the transport's unit tests (transport layer, tests only).
//
// FakeSg stands where /dev/sgN would: the transport gets one end of an AF_UNIX SOCK_SEQPACKET
// socketpair (non-blocking, as the sg fd is), and a thread serves the other end as sg's write() and
// read() do. It reads each sg_io_hdr the transport writes, records the request (CDB and data-out
// read through cmdp and dxferp: same process, so those pointers are valid), and answers as the
// script says, at once or only when the test calls answer(). An answer writes sense and data-in
// through sbp and dxferp, then sends the header back with the status fields, resid and sb_len_wr,
// so a transport that freed a command's buffers too early is caught by ASan.
//
// FakeSgIo stands where ioctl(fd, SG_IO, &hdr) would, for the SG_IO pool: it runs on the pool's
// threads, answers as the script says or blocks until the test calls release().
//
// Both are thread-safe (one mutex each); waits are bounded by kFakeWaitMax so that a broken
// transport fails a test instead of hanging it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <scsi/sg.h>

#include "blkfence/transport/transport.h"
#include "blkfence/unique_fd.h"

namespace blkfence::transport::test {

inline constexpr std::chrono::seconds kFakeWaitMax{10};

// What the fake device saw.
struct FakeRequest {
  std::int32_t pack_id = 0;
  std::vector<std::uint8_t> cdb;
  std::vector<std::uint8_t> data_out;
  int dxfer_direction = 0;
  std::uint32_t dxfer_len = 0;
  std::uint32_t timeout_ms = 0;
  std::uint8_t mx_sb_len = 0;
  int fd = -1;  // FakeSgIo only: the fd SG_IO was called on
};

// What the fake device answers.
struct FakeReply {
  int sg_io_result = 0;  // FakeSgIo only: what the ioctl returns (0 or -errno)
  std::uint8_t status = 0;
  std::uint16_t host_status = 0;
  std::uint16_t driver_status = 0;
  std::vector<std::uint8_t> sense;    // written through sbp, at most mx_sb_len
  std::vector<std::uint8_t> data_in;  // written through dxferp, at most dxfer_len
};

FakeRequest read_request(const sg_io_hdr& header);
// Fills the caller's buffers and the header's answer fields as sg_new_read() would.
void apply_reply(sg_io_hdr& header, const FakeReply& reply);

// A reply now, or nullopt to hold the request until the test answers it.
using FakeScript = std::function<std::optional<FakeReply>(const FakeRequest&)>;

// The marker tests put in CDB bytes 2-5 (reserved in a PR IN CDB) to tell commands apart.
std::uint32_t marker_of(const FakeRequest& request);
Command marked_command(std::uint32_t marker, std::uint64_t tag, std::chrono::milliseconds timeout,
                       std::uint32_t data_in_size = 16);

// Reaps until count completions have come (or kFakeWaitMax has passed); more may come back.
std::vector<Completion> reap_count(Transport& transport, std::size_t count);

class FakeSg {
 public:
  explicit FakeSg(FakeScript script);
  ~FakeSg();
  FakeSg(const FakeSg&) = delete;
  FakeSg& operator=(const FakeSg&) = delete;

  // The end the transport adopts in place of /dev/sgN (once).
  UniqueFd take_transport_end();

  // Answers a held request: late, or in whatever order the test likes. Returns false if it is
  // not held (or the transport has closed its end, after which its buffers must not be touched).
  bool answer(std::int32_t pack_id, const FakeReply& reply);

  // Bounded waits; false when kFakeWaitMax passed first.
  bool wait_received(std::size_t count);
  bool wait_held(std::size_t count);
  bool wait_peer_closed();

  std::vector<FakeRequest> received() const;
  std::vector<std::int32_t> held() const;  // in arrival order
  std::size_t outstanding_max() const;     // most requests received and not yet answered at once
  bool peer_closed() const;

 private:
  void serve();
  void answer_locked(sg_io_hdr& header, const FakeReply& reply);

  FakeScript script_;
  UniqueFd device_end_;
  UniqueFd transport_end_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<FakeRequest> received_;
  std::map<std::int32_t, sg_io_hdr> held_;
  std::vector<std::int32_t> held_order_;
  std::size_t outstanding_ = 0;
  std::size_t outstanding_max_ = 0;
  bool peer_closed_ = false;
  std::thread thread_;
};

class FakeSgIo {
 public:
  explicit FakeSgIo(FakeScript script) : script_(std::move(script)) {}

  // The SgIoFunction; called concurrently from the pool's workers.
  int operator()(int fd, sg_io_hdr& header);

  // Lets a blocked call return with reply.
  void release(std::int32_t pack_id, const FakeReply& reply);

  bool wait_blocked(std::size_t count);  // at least count calls blocked at once
  bool wait_returned(std::size_t count);

  std::vector<FakeRequest> received() const;
  std::vector<std::int32_t> blocked() const;  // pack ids, in arrival order
  std::size_t running_max() const;
  bool fd_was_open_at_every_return() const;

 private:
  FakeScript script_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<FakeRequest> received_;
  std::vector<std::int32_t> blocked_;
  std::map<std::int32_t, FakeReply> released_;
  std::size_t running_ = 0;
  std::size_t running_max_ = 0;
  std::size_t returned_ = 0;
  bool fd_always_open_ = true;
};

}  // namespace blkfence::transport::test

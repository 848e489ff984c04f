// Fake sg devices for the transport's unit tests (transport layer, tests only). See fake_sg.h.
#include "blkfence/testing/fake_sg.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/socket.h>

#include "blkfence/assert.h"
#include "blkfence/endian.h"

namespace blkfence::transport::test {

FakeRequest read_request(const sg_io_hdr& header) {
  FakeRequest request;
  request.pack_id = header.pack_id;
  request.cdb.assign(header.cmdp, header.cmdp + header.cmd_len);
  if (header.dxfer_direction == SG_DXFER_TO_DEV) {
    const auto* data = static_cast<const std::uint8_t*>(header.dxferp);
    request.data_out.assign(data, data + header.dxfer_len);
  }
  request.dxfer_direction = header.dxfer_direction;
  request.dxfer_len = header.dxfer_len;
  request.timeout_ms = header.timeout;
  request.mx_sb_len = header.mx_sb_len;
  return request;
}

void apply_reply(sg_io_hdr& header, const FakeReply& reply) {
  const std::size_t sense_size = std::min<std::size_t>(reply.sense.size(), header.mx_sb_len);
  if (sense_size > 0) {
    std::memcpy(header.sbp, reply.sense.data(), sense_size);
  }
  header.sb_len_wr = static_cast<unsigned char>(sense_size);
  header.resid = 0;
  if (header.dxfer_direction == SG_DXFER_FROM_DEV) {
    const std::size_t size = std::min<std::size_t>(reply.data_in.size(), header.dxfer_len);
    if (size > 0) {
      std::memcpy(header.dxferp, reply.data_in.data(), size);
    }
    header.resid = static_cast<int>(header.dxfer_len - size);
  }
  header.status = reply.status;
  header.masked_status = static_cast<unsigned char>((reply.status >> 1U) & 0x7fU);
  header.host_status = reply.host_status;
  header.driver_status = reply.driver_status;
  header.duration = 1;
  header.info = (reply.status != 0 || reply.host_status != 0 || reply.driver_status != 0)
                    ? SG_INFO_CHECK
                    : SG_INFO_OK;
}

std::uint32_t marker_of(const FakeRequest& request) {
  BLKFENCE_ASSERT(request.cdb.size() >= 6);
  return load_be32(request.cdb, 2);
}

Command marked_command(std::uint32_t marker, std::uint64_t tag, std::chrono::milliseconds timeout,
                       std::uint32_t data_in_size) {
  std::array<std::uint8_t, 10> cdb{0x5e};  // PERSISTENT RESERVE IN, READ KEYS
  store_be32(cdb, 2, marker);
  store_be16(cdb, 7, static_cast<std::uint16_t>(data_in_size));
  Command command = Command::from_cdb(cdb);
  command.direction = DataDirection::kFromDevice;
  command.data_in_size = data_in_size;
  command.timeout = timeout;
  command.tag = tag;
  return command;
}

std::vector<Completion> reap_count(Transport& transport, std::size_t count) {
  std::vector<Completion> completions;
  const auto give_up = std::chrono::steady_clock::now() + kFakeWaitMax;
  while (completions.size() < count && std::chrono::steady_clock::now() < give_up) {
    const auto reaped = transport.reap(std::chrono::milliseconds(100), completions);
    BLKFENCE_ASSERT(reaped.has_value());
  }
  return completions;
}

FakeSg::FakeSg(FakeScript script) : script_(std::move(script)) {
  int ends[2] = {-1, -1};
  const int rc = ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends);
  BLKFENCE_ASSERT(rc == 0);
  device_end_.reset(ends[0]);
  transport_end_.reset(ends[1]);
  // The transport's end is non-blocking, as an sg fd opened O_NONBLOCK is.
  const int flags = ::fcntl(transport_end_.get(), F_GETFL);
  BLKFENCE_ASSERT(flags >= 0 && ::fcntl(transport_end_.get(), F_SETFL, flags | O_NONBLOCK) == 0);
  thread_ = std::thread([this] { serve(); });
}

FakeSg::~FakeSg() {
  // Wakes serve() from recv() with end of file.
  (void)::shutdown(device_end_.get(), SHUT_RDWR);
  thread_.join();
}

UniqueFd FakeSg::take_transport_end() {
  BLKFENCE_ASSERT(transport_end_.valid());
  return std::move(transport_end_);
}

void FakeSg::serve() {
  for (;;) {
    sg_io_hdr header{};
    const ssize_t size = ::recv(device_end_.get(), &header, sizeof header, 0);
    if (size < 0 && errno == EINTR) {
      continue;
    }
    std::lock_guard lock(mutex_);
    if (size != static_cast<ssize_t>(sizeof header)) {
      // 0: the transport closed its end (or ~FakeSg shut ours); anything else ends the test's
      // device too.
      peer_closed_ = true;
      changed_.notify_all();
      return;
    }
    FakeRequest request = read_request(header);
    ++outstanding_;
    outstanding_max_ = std::max(outstanding_max_, outstanding_);
    const std::optional<FakeReply> reply = script_(request);
    received_.push_back(std::move(request));
    if (reply) {
      answer_locked(header, *reply);
    } else {
      held_.emplace(header.pack_id, header);
      held_order_.push_back(header.pack_id);
    }
    changed_.notify_all();
  }
}

void FakeSg::answer_locked(sg_io_hdr& header, const FakeReply& reply) {
  apply_reply(header, reply);
  --outstanding_;
  const ssize_t sent = ::send(device_end_.get(), &header, sizeof header, MSG_NOSIGNAL);
  BLKFENCE_ASSERT(sent == static_cast<ssize_t>(sizeof header) || peer_closed_);
}

bool FakeSg::answer(std::int32_t pack_id, const FakeReply& reply) {
  std::lock_guard lock(mutex_);
  const auto it = held_.find(pack_id);
  if (it == held_.end() || peer_closed_) {
    return false;
  }
  sg_io_hdr header = it->second;
  held_.erase(it);
  held_order_.erase(std::find(held_order_.begin(), held_order_.end(), pack_id));
  answer_locked(header, reply);
  changed_.notify_all();
  return true;
}

bool FakeSg::wait_received(std::size_t count) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, kFakeWaitMax, [&] { return received_.size() >= count; });
}

bool FakeSg::wait_held(std::size_t count) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, kFakeWaitMax, [&] { return held_.size() >= count; });
}

bool FakeSg::wait_peer_closed() {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, kFakeWaitMax, [&] { return peer_closed_; });
}

std::vector<FakeRequest> FakeSg::received() const {
  std::lock_guard lock(mutex_);
  return received_;
}

std::vector<std::int32_t> FakeSg::held() const {
  std::lock_guard lock(mutex_);
  return held_order_;
}

std::size_t FakeSg::outstanding_max() const {
  std::lock_guard lock(mutex_);
  return outstanding_max_;
}

bool FakeSg::peer_closed() const {
  std::lock_guard lock(mutex_);
  return peer_closed_;
}

int FakeSgIo::operator()(int fd, sg_io_hdr& header) {
  std::unique_lock lock(mutex_);
  FakeRequest request = read_request(header);
  request.fd = fd;
  const std::int32_t pack_id = request.pack_id;
  ++running_;
  running_max_ = std::max(running_max_, running_);
  std::optional<FakeReply> reply = script_(request);
  received_.push_back(std::move(request));
  if (!reply) {
    blocked_.push_back(pack_id);
    changed_.notify_all();
    // Bounded like every wait here: an unreleased call returns an error rather than hang a test.
    const bool released =
        changed_.wait_for(lock, kFakeWaitMax, [&] { return released_.contains(pack_id); });
    blocked_.erase(std::find(blocked_.begin(), blocked_.end(), pack_id));
    if (released) {
      reply = released_[pack_id];
      released_.erase(pack_id);
    } else {
      reply = FakeReply{};
      reply->sg_io_result = -ETIMEDOUT;
    }
  }
  apply_reply(header, *reply);
  fd_always_open_ = fd_always_open_ && ::fcntl(fd, F_GETFD) != -1;
  --running_;
  ++returned_;
  changed_.notify_all();
  return reply->sg_io_result;
}

void FakeSgIo::release(std::int32_t pack_id, const FakeReply& reply) {
  std::lock_guard lock(mutex_);
  released_[pack_id] = reply;
  changed_.notify_all();
}

bool FakeSgIo::wait_blocked(std::size_t count) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, kFakeWaitMax, [&] { return blocked_.size() >= count; });
}

bool FakeSgIo::wait_returned(std::size_t count) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, kFakeWaitMax, [&] { return returned_ >= count; });
}

std::vector<FakeRequest> FakeSgIo::received() const {
  std::lock_guard lock(mutex_);
  return received_;
}

std::vector<std::int32_t> FakeSgIo::blocked() const {
  std::lock_guard lock(mutex_);
  return blocked_;
}

std::size_t FakeSgIo::running_max() const {
  std::lock_guard lock(mutex_);
  return running_max_;
}

bool FakeSgIo::fd_was_open_at_every_return() const {
  std::lock_guard lock(mutex_);
  return fd_always_open_;
}

}  // namespace blkfence::transport::test

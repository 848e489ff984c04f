// blkfencectl's control-socket client (cli layer). See control_client.h.
#include "control_client.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace blkfence::cli {

std::string default_socket_path() {
  const char* path = std::getenv("BLKFENCE_SOCKET");
  return path != nullptr && *path != '\0' ? path : "/run/blkfence/control.sock";
}

Result<ControlClient> ControlClient::connect(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return tl::unexpected(Error::os(errno, "socket"));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    return fail(ErrorCode::kInvalidArgument, path + ": too long for a unix socket path");
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    return tl::unexpected(Error::os(errno, "connect " + path));
  }
  return ControlClient(std::move(fd));
}

Result<void> ControlClient::send(const control::Request& request) {
  const std::string line = control::encode_request(request);
  std::size_t sent = 0;
  while (sent < line.size()) {
    const ssize_t n = ::send(fd_.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return tl::unexpected(Error::os(errno, "send to blkfenced"));
    }
    sent += static_cast<std::size_t>(n);
  }
  return {};
}

Result<control::Reply> ControlClient::next(
    std::optional<std::chrono::steady_clock::time_point> deadline) {
  for (;;) {
    if (const auto newline = buffer_.find('\n'); newline != std::string::npos) {
      const std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      auto reply = control::parse_reply(line);
      if (!reply) {
        return fail(ErrorCode::kInvalidArgument,
                    "blkfenced sent something unreadable: " + reply.error());
      }
      return *reply;
    }
    int wait_ms = -1;
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          *deadline - std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::clamp<long>(left.count(), 0, 1'000'000'000L));
    }
    // A deadline already past still reads what has arrived (poll with no wait).
    pollfd p{.fd = fd_.get(), .events = POLLIN, .revents = 0};
    const int ready = ::poll(&p, 1, wait_ms);
    if (ready < 0 && errno != EINTR) {
      return tl::unexpected(Error::os(errno, "poll"));
    }
    if (ready == 0 && wait_ms >= 0) {
      return fail(ErrorCode::kIndeterminate, "timed out waiting for blkfenced");
    }
    if (ready <= 0) {
      continue;
    }
    char chunk[65536];
    const ssize_t got = ::recv(fd_.get(), chunk, sizeof chunk, 0);
    if (got == 0) {
      return tl::unexpected(Error::os(ECONNRESET, "blkfenced closed the connection"));
    }
    if (got < 0) {
      if (errno == EINTR) {
        continue;
      }
      return tl::unexpected(Error::os(errno, "read from blkfenced"));
    }
    buffer_.append(chunk, static_cast<std::size_t>(got));
    if (buffer_.size() > control::kMaxReplySize) {
      return fail(ErrorCode::kInvalidArgument, "blkfenced sent a line longer than the limit");
    }
  }
}

}  // namespace blkfence::cli

// blkfencectl's side of the control socket: connect, send one request, read replies and events
// with a deadline (cli layer). docs/control-protocol.md describes the wire. Blocking, one thread.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "blkfence/control/protocol.h"
#include "blkfence/error.h"
#include "blkfence/unique_fd.h"

namespace blkfence::cli {

// BLKFENCE_SOCKET, else /run/blkfence/control.sock.
std::string default_socket_path();

class ControlClient {
 public:
  [[nodiscard]] static Result<ControlClient> connect(const std::string& path);

  [[nodiscard]] Result<void> send(const control::Request& request);
  // The next reply or event; kIndeterminate when the deadline passes first; kOs (ECONNRESET) when
  // the daemon closed the connection.
  [[nodiscard]] Result<control::Reply> next(
      std::optional<std::chrono::steady_clock::time_point> deadline);
  int fd() const { return fd_.get(); }
  // Whether next() has a line already read: poll() on fd() does not announce it.
  bool has_line() const { return buffer_.find('\n') != std::string::npos; }

 private:
  explicit ControlClient(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
  std::string buffer_;
};

}  // namespace blkfence::cli

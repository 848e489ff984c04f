// How the transports are built, and the seams unit tests use (transport layer, not installed).
//
// Both implementations derive from TransportImpl, which adds what the public interface does not
// need: adopting an already-open fd as a path (a socket served by a fake sg device, instead of
// /dev/sgN) and counting zombies (commands reported kIndeterminate whose buffers the kernel still
// holds). The SG_IO pool takes its ioctl as a function, the way LevelDB's Env lets a test replace
// the file system. Same threading rules as Transport: one thread uses a transport.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "blkfence/transport/transport.h"
#include "blkfence/unique_fd.h"

#include "sg.h"

namespace blkfence::transport::detail {

class TransportImpl : public Transport {
 public:
  // Takes fd as a path without checking what it is: the transports' open_path() opens and checks
  // the device, then calls this. name is what errors and completions say about the path.
  [[nodiscard]] virtual Result<PathId> open_path_fd(UniqueFd fd, std::string name) = 0;
  // Commands reported to the caller (kIndeterminate) that the kernel has not returned yet.
  virtual std::size_t zombie_count() const = 0;
  std::optional<std::size_t> unreturned() const override { return zombie_count(); }
};

struct UringOptions {
  std::chrono::milliseconds deadline_grace = kDeadlineGraceDefault;
};
[[nodiscard]] Result<std::unique_ptr<TransportImpl>> make_uring_transport(
    const UringOptions& options);

// ioctl(fd, SG_IO, &header): 0 when sg ran the command (the answer is in header), else -errno.
using SgIoFunction = std::function<int(int fd, sg_io_hdr& header)>;
// The real one: ::ioctl.
int sg_io_ioctl(int fd, sg_io_hdr& header);

struct SgioOptions {
  std::size_t threads = 4;
  // At most this many workers in SG_IO on one path at once, stuck ones included, so that a path
  // whose SG_IO never returns holds that many workers and no more; 1 to kSgQueueDepth.
  std::size_t per_path_max = 2;
  std::chrono::milliseconds deadline_grace = kDeadlineGraceDefault;
  // Called from the pool's threads, concurrently; must be thread-safe.
  SgIoFunction sg_io = sg_io_ioctl;
};
[[nodiscard]] Result<std::unique_ptr<TransportImpl>> make_sgio_transport(
    const SgioOptions& options);

}  // namespace blkfence::transport::detail

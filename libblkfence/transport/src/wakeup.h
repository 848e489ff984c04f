// The file descriptor behind Transport::poll_fd() (transport layer, not installed).
//
// One epoll fd that polls readable when completions are waiting (an eventfd, signalled by io_uring
// for every CQE or by an SG_IO worker) or when the earliest deadline has passed (a timerfd on
// CLOCK_MONOTONIC, the clock of std::chrono::steady_clock). The daemon watches that one fd in
// sd-event and still wakes up to report a command nobody answered. Owns the three fds.
// notify() is thread-safe (workers call it); everything else belongs to the transport's thread.
#pragma once

#include <optional>

#include "blkfence/error.h"
#include "blkfence/unique_fd.h"

#include "sg.h"

namespace blkfence::transport::detail {

class Wakeup {
 public:
  [[nodiscard]] static Result<Wakeup> make();

  int poll_fd() const { return epoll_.get(); }
  // The eventfd itself, for io_uring_register_eventfd().
  int event_fd() const { return event_.get(); }

  // Makes poll_fd() readable (completions are ready without a kernel event, or a worker finished).
  void notify() const;
  // Consumes both events; call at the start of reap(), before looking for completions, so that
  // anything finishing afterwards signals again.
  void drain() const;
  // Makes poll_fd() readable at deadline (at once if it has passed); nullopt disarms.
  void arm(std::optional<Clock::time_point> deadline);

 private:
  Wakeup(UniqueFd epoll, UniqueFd event, UniqueFd timer)
      : epoll_(std::move(epoll)), event_(std::move(event)), timer_(std::move(timer)) {}

  UniqueFd epoll_;
  UniqueFd event_;
  UniqueFd timer_;
  std::optional<Clock::time_point> armed_;
};

}  // namespace blkfence::transport::detail

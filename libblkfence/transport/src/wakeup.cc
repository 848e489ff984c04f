// poll_fd(): an epoll fd over an eventfd and a timerfd (transport layer). See wakeup.h.
#include "wakeup.h"

#include <cerrno>
#include <cstdint>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>

#include "blkfence/assert.h"

namespace blkfence::transport::detail {

Result<Wakeup> Wakeup::make() {
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) {
    return tl::unexpected(Error::os(errno, "epoll_create1 for the transport's poll fd"));
  }
  UniqueFd event(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!event.valid()) {
    return tl::unexpected(Error::os(errno, "eventfd for the transport's poll fd"));
  }
  UniqueFd timer(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timer.valid()) {
    return tl::unexpected(Error::os(errno, "timerfd_create for the transport's poll fd"));
  }
  for (const int fd : {event.get(), timer.get()}) {
    epoll_event watch{};
    watch.events = EPOLLIN;
    watch.data.fd = fd;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &watch) != 0) {
      return tl::unexpected(Error::os(errno, "epoll_ctl for the transport's poll fd"));
    }
  }
  return Wakeup(std::move(epoll), std::move(event), std::move(timer));
}

void Wakeup::notify() const {
  // Fails only when the counter would overflow (EAGAIN), and then it is readable anyway.
  (void)::eventfd_write(event_.get(), 1);
}

void Wakeup::drain() const {
  std::uint64_t count = 0;
  // Both are non-blocking: EAGAIN means there was nothing to consume.
  (void)::read(event_.get(), &count, sizeof count);
  (void)::read(timer_.get(), &count, sizeof count);
}

void Wakeup::arm(std::optional<Clock::time_point> deadline) {
  if (deadline == armed_) {
    return;
  }
  itimerspec spec{};
  if (deadline) {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline->time_since_epoch()).count();
    // An all-zero it_value disarms; a deadline at the clock's origin is "now".
    const auto ns_positive = ns > 0 ? ns : 1;
    spec.it_value.tv_sec = static_cast<time_t>(ns_positive / 1'000'000'000);
    spec.it_value.tv_nsec = static_cast<long>(ns_positive % 1'000'000'000);
  }
  const int rc = ::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &spec, nullptr);
  BLKFENCE_ASSERT(rc == 0);  // fails only for invalid arguments
  armed_ = deadline;
}

}  // namespace blkfence::transport::detail

// An owned file descriptor (base layer).
//
// Closes the descriptor when destroyed; move-only. Every descriptor the library opens is put in one
// of these as soon as the system call returns, so no error path leaks it (and with O_CLOEXEC at
// every open, none leaks into a child). Thread-compatible.
#pragma once

#include <unistd.h>

namespace blkfence {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

  // close(2) frees the descriptor on Linux even when it reports an error (EINTR included), so there
  // is nothing to retry and nothing useful to return.
  void reset(int fd = -1) {
    if (fd_ >= 0) {
      (void)::close(fd_);
    }
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace blkfence

// Assertions that stay on in release builds (base layer).
//
// A failed assertion is a programmer error: the process prints where and aborts. Expected failures
// (a device answering badly, a missing file) are never asserted; they travel as blkfence::Error.
#pragma once

namespace blkfence::detail {
[[noreturn]] void assert_fail(const char* expr, const char* file, int line,
                              const char* func) noexcept;
}  // namespace blkfence::detail

#define BLKFENCE_ASSERT(expr)    \
  ((expr) ? static_cast<void>(0) \
          : ::blkfence::detail::assert_fail(#expr, __FILE__, __LINE__, __func__))

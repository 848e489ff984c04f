// Out-of-line failure path of BLKFENCE_ASSERT (base layer). Writes with stdio, which needs no
// allocation that could itself fail, and aborts so that a core dump keeps the state.
#include "blkfence/assert.h"

#include <cstdio>
#include <cstdlib>

namespace blkfence::detail {

void assert_fail(const char* expr, const char* file, int line, const char* func) noexcept {
  // Nothing useful is left to do if stderr fails: abort() follows either way.
  (void)std::fprintf(stderr, "blkfence: assertion failed: %s (%s:%d, %s)\n", expr, file, line,
                     func);
  (void)std::fflush(stderr);
  std::abort();
}

}  // namespace blkfence::detail

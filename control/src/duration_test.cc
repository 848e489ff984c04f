// Proves the one duration syntax of the configuration and the command line: the table of texts
// and what each means (or that it is refused), the bound, exactness where a fraction meets a unit
// that is not a power of ten, and that format_duration() writes what parse_duration() reads back.
#include "blkfence/control/duration.h"

#include <gtest/gtest.h>

namespace blkfence::control {
namespace {

using std::chrono::milliseconds;

struct Case {
  const char* text;
  std::optional<std::int64_t> ms;  // nullopt: refused
};

// The table both callers rely on (config keys such as lease and check_interval, and
// blkfencectl's --timeout).
constexpr Case kCases[] = {
    {"250ms", 250},
    {"0ms", 0},
    {"1s", 1000},
    {"2.5s", 2500},
    {"0.001s", 1},
    {"1.250s", 1250},
    {"2m", 120'000},
    {"1.5m", 90'000},
    {"0.0001m", 6},
    {"0.00005m", 3},  // 3 ms exactly, though 0.00001 min is not whole
    {"1h", 3'600'000},
    {"1.5h", 5'400'000},
    {"24h", 86'400'000},
    {"1440m", 86'400'000},
    {"000000001s", 1000},
    {"86400000ms", 86'400'000},
    {"24.000000001h", {}},  // over the bound, and not whole milliseconds either
    {"25h", {}},
    {"86400001ms", {}},  // above kMaxDuration
    {"999999999h", {}},
    {"999999999.999999999h", {}},  // no overflow on the way
    {"1000000000s", {}},           // ten digits
    {"0.5ms", {}},
    {"0.0001s", {}},  // finer than a millisecond
    {"0.00001m", {}},
    {"1.s", {}},
    {".5s", {}},
    {"s", {}},
    {"", {}},
    {"5", {}},  // no unit
    {"5 s", {}},
    {" 5s", {}},
    {"-1s", {}},
    {"+1s", {}},
    {"1e3ms", {}},
    {"1,5s", {}},
    {"1S", {}},
    {"1sec", {}},
    {"1min", {}},
    {"1d", {}},
    {"1.2.3s", {}},
    {"0x10s", {}},
};

TEST(Duration, TheTable) {
  for (const Case& c : kCases) {
    const auto parsed = parse_duration(c.text);
    if (c.ms) {
      ASSERT_TRUE(parsed.has_value()) << "'" << c.text << "' refused";
      EXPECT_EQ(parsed->count(), *c.ms) << c.text;
    } else {
      EXPECT_FALSE(parsed.has_value()) << "'" << c.text << "' accepted as " << parsed->count();
    }
  }
}

TEST(Duration, FormatIsCanonicalAndReadsBack) {
  EXPECT_EQ(format_duration(milliseconds(250)), "250ms");
  EXPECT_EQ(format_duration(milliseconds(1000)), "1s");
  EXPECT_EQ(format_duration(milliseconds(2500)), "2.5s");
  EXPECT_EQ(format_duration(milliseconds(120'000)), "120s");
  EXPECT_EQ(format_duration(milliseconds(1001)), "1.001s");
  const std::int64_t values[] = {0, 1, 999, 1000, 1001, 59'999, 3'600'000, kMaxDuration.count()};
  for (const std::int64_t ms : values) {
    EXPECT_EQ(parse_duration(format_duration(milliseconds(ms))), milliseconds(ms)) << ms;
  }
}

}  // namespace
}  // namespace blkfence::control

// Durations (control layer). See duration.h.
#include "blkfence/control/duration.h"

#include <algorithm>
#include <array>
#include <cstdint>

namespace blkfence::control {
namespace {

struct Unit {
  std::string_view suffix;
  std::int64_t milliseconds;
};
// "ms" before "m" and "s": the longest suffix that matches wins.
constexpr std::array<Unit, 4> kUnits{{{"ms", 1}, {"s", 1000}, {"m", 60'000}, {"h", 3'600'000}}};
constexpr std::size_t kMaxDigits = 9;  // on each side of the point

bool all_digits(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) {
  const auto* unit = std::find_if(kUnits.begin(), kUnits.end(),
                                  [&](const Unit& u) { return text.ends_with(u.suffix); });
  if (unit == kUnits.end()) {
    return std::nullopt;
  }
  text.remove_suffix(unit->suffix.size());
  const std::size_t point = text.find('.');
  const std::string_view whole = text.substr(0, point);
  const std::string_view fraction =
      point == std::string_view::npos ? std::string_view() : text.substr(point + 1);
  if (whole.empty() || whole.size() > kMaxDigits || !all_digits(whole) ||
      fraction.size() > kMaxDigits || !all_digits(fraction) ||
      (point != std::string_view::npos && fraction.empty())) {
    return std::nullopt;
  }
  // Whole and fraction apart, exactly: 10^9 units of at most 3.6 * 10^6 ms each fit in 64 bits.
  std::int64_t whole_part = 0;
  std::int64_t fraction_part = 0;
  std::int64_t denominator = 1;
  for (const char c : whole) {
    whole_part = whole_part * 10 + (c - '0');
  }
  for (const char c : fraction) {
    fraction_part = fraction_part * 10 + (c - '0');
    denominator *= 10;
  }
  const std::int64_t fraction_scaled = fraction_part * unit->milliseconds;
  if (fraction_scaled % denominator != 0) {
    return std::nullopt;  // finer than a millisecond
  }
  const std::int64_t value = whole_part * unit->milliseconds + fraction_scaled / denominator;
  if (value > kMaxDuration.count()) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(value);
}

std::string format_duration(std::chrono::milliseconds duration) {
  const std::int64_t ms = duration.count();
  if (ms < 1000 && ms > -1000) {
    return std::to_string(ms) + "ms";
  }
  std::string text = std::to_string(ms / 1000);
  std::int64_t fraction = ms % 1000;
  if (fraction != 0) {
    fraction = fraction < 0 ? -fraction : fraction;
    std::string digits = std::to_string(1000 + fraction).substr(1);  // three digits
    while (digits.back() == '0') {
      digits.pop_back();
    }
    text += '.';
    text += digits;
  }
  return text + "s";
}

}  // namespace blkfence::control

// Durations as people type them, in the configuration and on blkfencectl's command line alike
// (control layer): a decimal number and a unit, "250ms", "1s", "2.5s", "2m", "1.5h". A fraction is
// accepted where the value comes to whole milliseconds ("0.5ms" is not). No unit, a sign, spaces,
// an exponent or more than kMaxDuration is an error. Pure functions, thread-safe.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace blkfence::control {

// The longest duration anything takes; each caller narrows its own range further.
inline constexpr std::chrono::milliseconds kMaxDuration{24LL * 3600 * 1000};

// The value, or nullopt when the text is not such a duration.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view text);

// The canonical text: whole milliseconds below a second ("250ms"), else seconds with the fraction
// they need ("1s", "2.5s", "120s"). parse_duration() reads it back to the same value.
std::string format_duration(std::chrono::milliseconds duration);

// What a message says is expected, for errors that quote the text they refused.
inline constexpr std::string_view kDurationSyntax =
    "a number and a unit (ms, s, m or h): \"250ms\", \"1s\", \"2.5s\", \"2m\"";

}  // namespace blkfence::control

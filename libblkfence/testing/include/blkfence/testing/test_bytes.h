// Golden byte vectors from text, for the codec tests only (codec layer, not installed).
//
// Accepts the notation of docs/reference/spc4-pr.md §11 so that its worked examples can be pasted
// verbatim: hex bytes separated by spaces, "00×8" (or "00x8") for a repeated byte, and "│" or "|"
// as a visual separator. A malformed golden is a bug in the test and asserts.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "blkfence/assert.h"

namespace blkfence::codec::test {

inline std::vector<std::uint8_t> hex(std::string_view text) {
  std::vector<std::uint8_t> bytes;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t end = std::min(text.find(' ', i), text.size());
    std::string token(text.substr(i, end - i));
    i = end + 1;
    if (token.empty() || token == "|" || token == "│") {
      continue;
    }
    unsigned repeat = 1;
    for (const std::string_view times : {"×", "x"}) {
      if (const std::size_t at = token.find(times); at != std::string::npos) {
        const char* first = token.data() + at + times.size();
        const auto [end_of_count, ec] = std::from_chars(first, token.data() + token.size(), repeat);
        BLKFENCE_ASSERT(ec == std::errc() && end_of_count == token.data() + token.size());
        token.resize(at);
        break;
      }
    }
    std::uint8_t value = 0;
    const auto [end_of_byte, ec] =
        std::from_chars(token.data(), token.data() + token.size(), value, 16);
    BLKFENCE_ASSERT(token.size() == 2 && ec == std::errc() && end_of_byte == token.data() + 2);
    bytes.insert(bytes.end(), repeat, value);
  }
  return bytes;
}

inline std::vector<std::uint8_t> concat(std::initializer_list<std::vector<std::uint8_t>> parts) {
  std::vector<std::uint8_t> bytes;
  for (const auto& part : parts) {
    bytes.insert(bytes.end(), part.begin(), part.end());
  }
  return bytes;
}

// The bytes of text, NUL-padded to size (at least one NUL unless size is text.size()).
inline std::vector<std::uint8_t> ascii(std::string_view text, std::size_t size) {
  BLKFENCE_ASSERT(text.size() <= size);
  std::vector<std::uint8_t> bytes(text.begin(), text.end());
  bytes.resize(size, 0);
  return bytes;
}

// The keys of docs/reference/spc4-pr.md §11's worked examples (node A, node B).
inline constexpr std::uint64_t kKeyA = 0x4c494f0000000001ULL;
inline constexpr std::uint64_t kKeyB = 0x4c494f0000000002ULL;

// A CDB as bytes, to compare with hex() goldens.
template <std::size_t N>
std::vector<std::uint8_t> cdb_bytes(const std::array<std::uint8_t, N>& cdb) {
  return {cdb.begin(), cdb.end()};
}

}  // namespace blkfence::codec::test

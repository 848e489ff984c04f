// Text rules shared by the configuration, the control protocol and the CLI (control layer): where
// UTF-8 may be cut, and what a cluster or resource name may be. Pure functions, thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace blkfence::control {

inline constexpr std::size_t kMaxNameSize = 64;  // cluster and resource names

// Where UTF-8 text may be cut without splitting a character: at most `limit` bytes.
inline std::size_t utf8_cut(std::string_view text, std::size_t limit) {
  if (text.size() <= limit) {
    return text.size();
  }
  std::size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0U) == 0x80U) {
    --cut;
  }
  return cut;
}

// A resource's name: 1 to kMaxNameSize characters of A-Z a-z 0-9 _ . - (it names files in
// run_dir and state_dir, and travels in requests).
inline bool is_valid_resource_name(std::string_view name) {
  const auto allowed = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
  };
  return !name.empty() && name.size() <= kMaxNameSize &&
         std::all_of(name.begin(), name.end(), allowed);
}

}  // namespace blkfence::control

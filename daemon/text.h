// Small text helpers shared by the configuration and the control protocol (daemon layer).
#pragma once

#include <cstddef>
#include <string_view>

namespace blkfence::daemon {

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

}  // namespace blkfence::daemon

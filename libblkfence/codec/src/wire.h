// Private helpers every codec decoder shares (codec layer, not installed).
//
// body_after() is the one place where a length the device reported becomes a span to decode: it
// never yields more than the buffer holds and says when the device claimed more;
// for_each_descriptor() walks descriptor lists with it. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "blkfence/assert.h"
#include "blkfence/endian.h"

namespace blkfence::codec::detail {

struct Body {
  Bytes bytes;     // what is really there, at most claimed_size bytes
  bool truncated;  // the buffer ended before claimed_size bytes
};

// The body after a header_size-byte header whose length field claims claimed_size bytes.
// The caller has checked that the header itself is in the buffer.
inline Body body_after(Bytes buf, std::size_t header_size, std::uint64_t claimed_size) {
  BLKFENCE_ASSERT(header_size <= buf.size());
  const std::size_t available = buf.size() - header_size;
  if (claimed_size > available) {
    return {buf.subspan(header_size), true};
  }
  return {buf.subspan(header_size, static_cast<std::size_t>(claimed_size)), false};
}

// Walks a list of descriptors, each a header_size-byte header whose length field (read by
// length_of from the header) counts the bytes after it, and calls visit(header, value) for every
// complete one. Returns true when the list ends inside a descriptor. Each round consumes at least
// the header, so the walk is bounded by the list.
template <class LengthOf, class Visit>
bool for_each_descriptor(Bytes list, std::size_t header_size, LengthOf length_of, Visit visit) {
  BLKFENCE_ASSERT(header_size > 0);
  while (!list.empty()) {
    if (list.size() < header_size) {
      return true;
    }
    const Bytes header = list.first(header_size);
    const Body value = body_after(list, header_size, length_of(header));
    if (value.truncated) {
      return true;
    }
    visit(header, value.bytes);
    list = list.subspan(header_size + value.bytes.size());
  }
  return false;
}

// Lower-case hex, no separators: the form of "naa.6001405..." and of sg_persist's SAS addresses.
inline void append_hex(std::string& out, Bytes bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (const std::uint8_t byte : bytes) {
    out += kDigits[byte >> 4U];
    out += kDigits[byte & 0x0fU];
  }
}

// Text up to the first NUL (SPC-4 4.3.2: null-terminated, null-padded fields).
inline std::string text_until_nul(Bytes bytes) {
  std::string text;
  for (const std::uint8_t byte : bytes) {
    if (byte == 0) {
      break;
    }
    text += static_cast<char>(byte);
  }
  return text;
}

}  // namespace blkfence::codec::detail

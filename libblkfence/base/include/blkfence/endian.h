// Big-endian loads and stores over byte spans (base layer).
//
// SCSI puts every multi-byte field big-endian at a fixed offset; reading fields one by one with
// these helpers, instead of overlaying packed structs, keeps the codec free of alignment and
// padding assumptions. Each access is bounds-checked by an assertion: callers check lengths before
// decoding. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "blkfence/assert.h"

namespace blkfence {

using Bytes = std::span<const std::uint8_t>;
using MutableBytes = std::span<std::uint8_t>;

namespace detail {
template <class T>
constexpr T load_be(Bytes buf, std::size_t offset) {
  BLKFENCE_ASSERT(offset <= buf.size() && sizeof(T) <= buf.size() - offset);
  T value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    value = static_cast<T>((value << 8U) | buf[offset + i]);
  }
  return value;
}

template <class T>
constexpr void store_be(MutableBytes buf, std::size_t offset, T value) {
  BLKFENCE_ASSERT(offset <= buf.size() && sizeof(T) <= buf.size() - offset);
  for (std::size_t i = sizeof(T); i-- > 0;) {
    buf[offset + i] = static_cast<std::uint8_t>(value & 0xffU);
    value = static_cast<T>(value >> 8U);
  }
}
}  // namespace detail

constexpr std::uint16_t load_be16(Bytes buf, std::size_t offset) {
  return detail::load_be<std::uint16_t>(buf, offset);
}
constexpr std::uint32_t load_be32(Bytes buf, std::size_t offset) {
  return detail::load_be<std::uint32_t>(buf, offset);
}
constexpr std::uint64_t load_be64(Bytes buf, std::size_t offset) {
  return detail::load_be<std::uint64_t>(buf, offset);
}

constexpr void store_be16(MutableBytes buf, std::size_t offset, std::uint16_t value) {
  detail::store_be(buf, offset, value);
}
constexpr void store_be32(MutableBytes buf, std::size_t offset, std::uint32_t value) {
  detail::store_be(buf, offset, value);
}
constexpr void store_be64(MutableBytes buf, std::size_t offset, std::uint64_t value) {
  detail::store_be(buf, offset, value);
}

}  // namespace blkfence

// Reservation key construction, parsing and formatting (fence layer). Pure, thread-safe.
#include "blkfence/key.h"

#include <charconv>
#include <cstdio>

namespace blkfence::fence {

std::uint16_t cluster_id_from_name(std::string_view cluster_name) {
  std::uint32_t hash = 2166136261U;  // FNV-1a offset basis
  for (const char c : cluster_name) {
    hash ^= static_cast<std::uint8_t>(c);
    hash *= 16777619U;  // FNV prime
  }
  return static_cast<std::uint16_t>((hash >> 16U) ^ (hash & 0xffffU));
}

Result<Key> Key::make(std::uint16_t cluster_id, std::uint16_t node_id, std::uint32_t epoch) {
  if (node_id < kNodeIdMin) {
    return fail(ErrorCode::kInvalidArgument, "node id 0 (node ids are 1..65535)");
  }
  return Key((std::uint64_t{cluster_id} << 48U) | (std::uint64_t{node_id} << 32U) | epoch);
}

Result<Key> Key::from_value(std::uint64_t value) {
  if (value == 0) {
    return fail(ErrorCode::kInvalidArgument, "key 0 (SPC-4 reserves 0 for \"no key\")");
  }
  return Key(value);
}

Result<Key> Key::from_wire(Bytes eight_bytes) {
  if (eight_bytes.size() != 8) {
    return fail(ErrorCode::kInvalidArgument, "a key is exactly 8 bytes");
  }
  return from_value(load_be64(eight_bytes, 0));
}

Result<Key> Key::parse(std::string_view text) {
  const std::string where = "key '" + std::string(text) + "'";
  std::string_view digits = text;
  if (digits.starts_with("0x") || digits.starts_with("0X")) {
    digits.remove_prefix(2);
  }
  if (digits.empty() || digits.size() > 16) {
    return fail(ErrorCode::kInvalidArgument, where + ": expected 1 to 16 hex digits");
  }
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value, 16);
  if (ec != std::errc() || end != digits.data() + digits.size()) {
    return fail(ErrorCode::kInvalidArgument, where + ": not a hex number");
  }
  auto key = from_value(value);
  if (!key) {
    return fail(ErrorCode::kInvalidArgument, where + ": " + key.error().where());
  }
  return key;
}

std::string Key::format(std::uint64_t value) {
  char text[19];  // "0x" + 16 digits + NUL: snprintf cannot truncate
  (void)std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string Key::to_string() const {
  return format(value_);
}

}  // namespace blkfence::fence

// The reservation key, which is also the fencing token (fence layer).
//
// docs/design.md §2: a key is 8 bytes, cluster:16 | node:16 | epoch:32, big-endian on the wire. The
// cluster field is derived from the configured cluster name so that keys of different clusters
// sharing a target never compare equal; the node field is the configured node id (1..65535, never
// 0, so a key is never the all-zero "no key" of SPC-4); the epoch grows on every acquisition of a
// resource. Value type, thread-compatible.
#pragma once

#include <compare>
#include <cstdint>
#include <string>
#include <string_view>

#include "blkfence/endian.h"
#include "blkfence/error.h"

namespace blkfence::fence {

// FNV-1a (32 bit) of the name, folded to 16 bits. Stable across versions and machines: changing it
// would make every node of an upgraded cluster a stranger to its peers' keys.
std::uint16_t cluster_id_from_name(std::string_view cluster_name);

class Key {
 public:
  static constexpr std::uint16_t kNodeIdMin = 1;
  static constexpr std::uint16_t kNodeIdMax = 0xffff;
  // The highest epoch blkfence draws. The 65 536 above it are never drawn, so a key of the
  // cluster with one of them is a stray (typed by hand, another tool's, corrupted), the token of
  // no node: it counts for nothing in a draw and is never stored as seen, so it cannot end the
  // epoch space for good (docs/protocol.md, "The top of the epoch space").
  static constexpr std::uint32_t kEpochDrawMax = 0xfffeffff;
  // Shared mode: a member registers epoch 0, and its release re-keys its nexuses to epoch 1, the
  // departed key, which opens no gate and is never adopted but keeps the All Registrants
  // reservation on the LUs when no member is left (docs/protocol.md, "Shared mode").
  static constexpr std::uint32_t kEpochDeparted = 1;

  // A key from its fields; node_id must be in [kNodeIdMin, kNodeIdMax].
  [[nodiscard]] static Result<Key> make(std::uint16_t cluster_id, std::uint16_t node_id,
                                        std::uint32_t epoch);
  // A key as read from a device. Zero is not a key (SPC-4: 0 means "no key").
  [[nodiscard]] static Result<Key> from_value(std::uint64_t value);
  // Hex with or without "0x", 1 to 16 digits, as users type keys (sg_persist accepts the same).
  [[nodiscard]] static Result<Key> parse(std::string_view text);
  [[nodiscard]] static Result<Key> from_wire(Bytes eight_bytes);

  // The fields of a key value as read from a device, whoever registered it.
  static constexpr std::uint16_t cluster_of(std::uint64_t value) {
    return static_cast<std::uint16_t>(value >> 48U);
  }
  static constexpr std::uint16_t node_of(std::uint64_t value) {
    return static_cast<std::uint16_t>(value >> 32U);
  }
  static constexpr std::uint32_t epoch_of(std::uint64_t value) {
    return static_cast<std::uint32_t>(value);
  }
  static constexpr bool epoch_reserved(std::uint32_t epoch) { return epoch > kEpochDrawMax; }
  // Any key value (0 included) as to_string() prints a key.
  static std::string format(std::uint64_t value);

  std::uint64_t value() const { return value_; }
  std::uint16_t cluster_id() const { return cluster_of(value_); }
  std::uint16_t node_id() const { return node_of(value_); }
  std::uint32_t epoch() const { return epoch_of(value_); }

  void to_wire(MutableBytes eight_bytes) const { store_be64(eight_bytes, 0, value_); }
  // "0x" and 16 lowercase hex digits, the form sg_persist prints.
  std::string to_string() const;

  friend bool operator==(Key, Key) = default;
  // clang-tidy 14 mistakes the defaulted comparison's literal 0 for a null pointer.
  friend auto operator<=>(Key, Key) = default;  // NOLINT(modernize-use-nullptr)

 private:
  explicit constexpr Key(std::uint64_t value) : value_(value) {}
  std::uint64_t value_;
};

}  // namespace blkfence::fence

// One read of every LU, as the operations of fence::Resource see it (private to the fence layer).
#pragma once

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "blkfence/codec/prin.h"
#include "blkfence/fence/resource.h"
#include "blkfence/pr/engine.h"

namespace blkfence::fence {

// One read of every LU: READ RESERVATION always, READ KEYS when asked, and with them READ FULL
// STATUS where this node's initiator ports are known (docs/protocol.md, "Identical keys").
struct Resource::Reads {
  struct Lu {
    std::optional<codec::ReadReservation> reservation;
    std::optional<codec::ReadKeys> keys;
    // nullopt: not asked, or refused as unsupported (ILLEGAL REQUEST); any other failure is the
    // LU's error.
    std::optional<codec::FullStatus> full;
    std::string error;
  };
  std::vector<Lu> lus;
  bool unit_attention = false;
  Time started{0};

  bool ok() const {
    return std::all_of(lus.begin(), lus.end(), [](const Lu& lu) { return lu.error.empty(); });
  }
  std::string errors(const std::vector<pr::LogicalUnit>& units) const {
    std::string text;
    for (std::size_t i = 0; i < lus.size(); ++i) {
      if (!lus[i].error.empty()) {
        text += (text.empty() ? "" : "; ") + units[i].name + ": " + lus[i].error;
      }
    }
    return text;
  }
  std::optional<std::uint64_t> holder(std::size_t lu) const {
    const auto& reservation = lus[lu].reservation;
    if (!reservation || !reservation->reservation) {
      return std::nullopt;
    }
    return reservation->reservation->key;
  }
  bool registered(std::size_t lu, std::uint64_t key) const {
    const auto& keys = lus[lu].keys;
    return keys && std::find(keys->keys.begin(), keys->keys.end(), key) != keys->keys.end();
  }
  // Keys other than key registered on the LU, each once.
  std::vector<std::uint64_t> others(std::size_t lu, std::uint64_t key) const {
    std::set<std::uint64_t> found;
    if (lus[lu].keys) {
      for (const std::uint64_t k : lus[lu].keys->keys) {
        if (k != key) {
          found.insert(k);
        }
      }
    }
    return {found.begin(), found.end()};
  }
};

// The first error among responses, or empty when every command succeeded.
inline std::string first_error(const std::vector<pr::Response>& responses) {
  for (const auto& response : responses) {
    if (!response.data) {
      return response.data.error().message();
    }
  }
  return {};
}

}  // namespace blkfence::fence

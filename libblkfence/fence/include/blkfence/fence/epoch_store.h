// Where a node keeps the highest epoch it has used for each resource (fence layer).
//
// S3 (docs/protocol.md): epochs of a resource never go backwards, across daemon restarts and LUN
// resets. The devices remember the keys registered on them, but a CLEAR or a reset of the target's
// PR state forgets them; the high-water mark on the node's own disk does not. The file store
// writes RESOURCE.epoch beside a temporary, fsyncs it, renames it over the old one and fsyncs the
// directory, so a crash leaves the old value or the new one, never neither. Thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "blkfence/error.h"

namespace blkfence::fence {

class EpochStore {
 public:
  virtual ~EpochStore() = default;
  // 0 when the resource has no stored epoch yet.
  [[nodiscard]] virtual Result<std::uint32_t> load(const std::string& resource) = 0;
  // Durable when it returns.
  [[nodiscard]] virtual Result<void> store(const std::string& resource, std::uint32_t epoch) = 0;
};

// dir/RESOURCE.epoch holding the epoch in decimal and a newline.
std::unique_ptr<EpochStore> make_file_epoch_store(std::string dir);

// In memory, for tests and the simulation (a simulated node's "disk" outlives its daemon).
class MemoryEpochStore final : public EpochStore {
 public:
  [[nodiscard]] Result<std::uint32_t> load(const std::string& resource) override;
  [[nodiscard]] Result<void> store(const std::string& resource, std::uint32_t epoch) override;

 private:
  std::map<std::string, std::uint32_t> epochs_;
};

}  // namespace blkfence::fence

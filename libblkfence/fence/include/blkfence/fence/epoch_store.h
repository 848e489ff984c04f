// Where a node keeps the epochs of each resource (fence layer).
//
// S3 (docs/protocol.md): epochs of a resource never go backwards, across daemon restarts and LU
// resets. The devices remember the keys registered on them, but a CLEAR or a target that forgets
// its PR state (a power cycle without APTPL) forgets them; the node's own disk does not. It keeps
// the epoch of the last key this node drew (the token a restart may adopt) and the highest epoch of
// the cluster it has seen on the LUs from any node. The file store writes RESOURCE.epoch beside a
// temporary, fsyncs it, renames it over the old one and fsyncs the directory, so a crash leaves the
// old value or the new one, never neither. Thread-compatible.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <sys/types.h>

#include "blkfence/error.h"

namespace blkfence::fence {

// What a node keeps for one resource.
struct StoredEpochs {
  // The epoch of the last key this node drew, or one above it once that key was given up (release,
  // a failed acquire): a key of ours with exactly this epoch is the token a restart may adopt.
  std::uint32_t used = 0;
  // The highest epoch of this cluster seen on the LUs from any node (at least used): no new key may
  // be drawn at or below it, whatever the LUs show later.
  std::uint32_t seen = 0;
  // A REGISTER of a key this node drew may have been sent and its outcome is not known yet: set
  // before an acquire, promote or unfence registers its new key, cleared once every REGISTER of
  // ours was answered or can no longer execute. A restart that finds it set waits until a REGISTER
  // of the run before can no longer execute before it registers anything (docs/protocol.md,
  // "Late registrations").
  bool registering = false;

  std::uint32_t high_water() const { return used > seen ? used : seen; }
  bool operator==(const StoredEpochs&) const = default;
};

class EpochStore {
 public:
  virtual ~EpochStore() = default;
  // nullopt when the resource has nothing stored (no file): the node's first start, or a file
  // lost since; the caller tells the two apart by what the LUs show (docs/protocol.md, S3).
  [[nodiscard]] virtual Result<std::optional<StoredEpochs>> load(const std::string& resource) = 0;
  // Durable when it returns. On an error the previous value is still the stored one, or (the
  // directory's fsync failed after the rename) the new one.
  [[nodiscard]] virtual Result<void> store(const std::string& resource, StoredEpochs epochs) = 0;
  // Where the epoch of resource lives, for messages (a path for the file store).
  virtual std::string where(const std::string& resource) const = 0;
};

// The system calls the file store makes, each returning what the call returns or -errno (never
// errno). system() is the real ones; tests replace some to inject faults (ENOSPC, EIO, EROFS).
struct EpochFileCalls {
  std::function<int(const std::string& path, int flags, mode_t mode)> open;
  std::function<ssize_t(int fd, void* buffer, std::size_t size)> read;
  std::function<ssize_t(int fd, const void* buffer, std::size_t size)> write;
  std::function<int(int fd)> fsync;
  std::function<int(const std::string& from, const std::string& to)> rename;
  std::function<int(const std::string& path)> unlink;

  static EpochFileCalls system();
};

// dir/RESOURCE.epoch holding "USED SEEN" in decimal and a newline, or "USED" alone when the two are
// equal (the format of earlier releases, which kept only the epoch the node drew); "USED SEEN
// registering" while StoredEpochs::registering is set.
std::unique_ptr<EpochStore> make_file_epoch_store(std::string dir,
                                                  EpochFileCalls calls = EpochFileCalls::system());

// In memory, for tests and the simulation (a simulated node's "disk" outlives its daemon).
class MemoryEpochStore final : public EpochStore {
 public:
  [[nodiscard]] Result<std::optional<StoredEpochs>> load(const std::string& resource) override;
  [[nodiscard]] Result<void> store(const std::string& resource, StoredEpochs epochs) override;
  std::string where(const std::string& resource) const override;
  // The file is lost (an operator removed the state directory, a fresh disk).
  void forget(const std::string& resource) { epochs_.erase(resource); }

 private:
  std::map<std::string, StoredEpochs> epochs_;
};

}  // namespace blkfence::fence

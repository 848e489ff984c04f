// The epoch store as the event loop uses it: the file store's work on a thread of its own, waited
// for at most a bound (daemon layer).
//
// An acquire, a promote or an unfence stores its new epoch, fsync'ed, before its REGISTER (S3,
// docs/protocol.md), and the fence layer calls the store synchronously from the loop. A disk that
// stalls the fsync would stall the loop with it: every resource's monitor, the lease, the control
// socket. BoundedEpochStore hands each load and store to its worker thread and waits for it at most
// `wait`. Past that the call fails ("not durable in time"): the operation ends before its PR OUT,
// as on any store error, and the loop goes on. The worker finishes the stalled call on its own
// (the file then holds the new epochs or the old, never less: S3 holds either way), and until it
// has, every further call fails at once instead of queueing behind it. Not thread-safe (the loop's
// thread calls it); the worker is its own.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "blkfence/fence/epoch_store.h"

namespace blkfence::daemon {

class BoundedEpochStore final : public fence::EpochStore {
 public:
  BoundedEpochStore(std::unique_ptr<fence::EpochStore> inner, std::chrono::milliseconds wait);
  // Joins the worker, or leaves it to finish a stalled call on its own (it owns what it uses).
  ~BoundedEpochStore() override;
  BoundedEpochStore(const BoundedEpochStore&) = delete;
  BoundedEpochStore& operator=(const BoundedEpochStore&) = delete;

  [[nodiscard]] Result<std::optional<fence::StoredEpochs>> load(
      const std::string& resource) override;
  [[nodiscard]] Result<void> store(const std::string& resource,
                                   fence::StoredEpochs epochs) override;
  // The inner store's (a path: no disk access).
  std::string where(const std::string& resource) const override;

 private:
  struct Shared;
  template <typename T>
  Result<T> call(const std::string& what, std::function<Result<T>(fence::EpochStore&)> work);

  std::shared_ptr<Shared> shared_;
  std::chrono::milliseconds wait_;
};

}  // namespace blkfence::daemon

// The epoch store on a worker thread, waited for at most a bound (daemon layer). See
// epoch_worker.h.
#include "epoch_worker.h"

#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>
#include <utility>

#include <pthread.h>

namespace blkfence::daemon {

// What the loop's thread and the worker share; the worker keeps it alive past the store's end.
struct BoundedEpochStore::Shared {
  std::mutex mutex;
  std::condition_variable changed;
  std::unique_ptr<fence::EpochStore> inner;  // the worker's alone, but for where()
  std::function<void()> job;                 // handed over, not yet taken
  bool busy = false;                         // a job handed over and not finished
  bool stop = false;
  std::thread worker;

  void run() {
    // Signals are for the event loop's signalfd; none may be delivered here.
    sigset_t all;
    sigfillset(&all);
    (void)pthread_sigmask(SIG_BLOCK, &all, nullptr);
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [this] { return stop || job; });
      if (!job) {
        return;
      }
      const auto work = std::exchange(job, nullptr);
      lock.unlock();
      work();
      lock.lock();
      busy = false;
      changed.notify_all();
    }
  }
};

BoundedEpochStore::BoundedEpochStore(std::unique_ptr<fence::EpochStore> inner,
                                     std::chrono::milliseconds wait)
    : shared_(std::make_shared<Shared>()), wait_(wait) {
  shared_->inner = std::move(inner);
  shared_->worker = std::thread([shared = shared_] { shared->run(); });
}

BoundedEpochStore::~BoundedEpochStore() {
  bool stalled = false;
  {
    const std::lock_guard lock(shared_->mutex);
    shared_->stop = true;
    stalled = shared_->busy;
  }
  shared_->changed.notify_all();
  // A call still stalled on the disk: the worker ends after it, holding shared_ itself.
  if (stalled) {
    shared_->worker.detach();
  } else {
    shared_->worker.join();
  }
}

template <typename T>
Result<T> BoundedEpochStore::call(const std::string& what,
                                  std::function<Result<T>(fence::EpochStore&)> work) {
  struct Outcome {
    std::optional<Result<T>> result;
  };
  auto outcome = std::make_shared<Outcome>();
  std::unique_lock lock(shared_->mutex);
  if (shared_->busy) {
    return fail(ErrorCode::kBusy, what +
                                      ": the previous access to the epoch store has not "
                                      "finished yet (a stalled disk?)");
  }
  shared_->busy = true;
  shared_->job = [shared = shared_.get(), outcome, work = std::move(work)] {
    Result<T> result = work(*shared->inner);
    const std::lock_guard done(shared->mutex);
    outcome->result = std::move(result);
  };
  shared_->changed.notify_all();
  if (!shared_->changed.wait_for(lock, wait_, [&] { return outcome->result.has_value(); })) {
    return fail(ErrorCode::kIndeterminate,
                what + ": not done after " + std::to_string(wait_.count()) +
                    " ms (a stalled disk?); the event loop does not wait longer, and nothing "
                    "is registered with an epoch that is not durable");
  }
  return std::move(*outcome->result);
}

Result<std::optional<fence::StoredEpochs>> BoundedEpochStore::load(const std::string& resource) {
  return call<std::optional<fence::StoredEpochs>>(
      "read " + where(resource),
      [resource](fence::EpochStore& inner) { return inner.load(resource); });
}

Result<void> BoundedEpochStore::store(const std::string& resource, fence::StoredEpochs epochs) {
  return call<void>("store " + where(resource), [resource, epochs](fence::EpochStore& inner) {
    return inner.store(resource, epochs);
  });
}

std::string BoundedEpochStore::where(const std::string& resource) const {
  return shared_->inner->where(resource);
}

}  // namespace blkfence::daemon

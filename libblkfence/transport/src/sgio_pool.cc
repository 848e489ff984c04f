// Blocking SG_IO on a bounded pool of threads (transport layer): the transport to use when the
// kernel refuses io_uring (docs/reference/linux-sg.md §3), and the only one that takes block
// devices.
//
// Each command is a Job: its SgRequest (header and buffers), the fd it runs on and its state. The
// transport's thread and the one worker running a job share it through shared_ptr, so that a
// worker stuck in SG_IO past the job's deadline still owns live buffers and an open fd when the
// kernel finally returns; the caller has long had kIndeterminate, and that late result is dropped
// with the job. Workers never touch the transport object: they take jobs from the Pool's queue,
// call SgioOptions::sg_io, put the finished job on the Pool's done list and signal the eventfd. The
// Pool (mutex, queues, eventfd) is shared by the transport and every worker, so a worker that
// outlives the transport (destroyed while it was stuck in SG_IO; it is detached, not joined) still
// has somewhere to return to. State shared with workers is guarded by Pool::mutex; the transport
// object itself is used from one thread.
//
// A hung path (an SG_IO that never returns: a link the host has not declared dead, a target that
// swallows the command) must not stall the other paths' commands: a worker takes the oldest queued
// job whose path has fewer than SgioOptions::per_path_max jobs in SG_IO (stuck ones included), and
// each job that overran its deadline in SG_IO gets a new worker beside it, so that `threads`
// workers stay free for the paths that answer (at most kWorkersMax in all). A hung path's own
// further commands wait for its workers and end kOsError/ETIMEDOUT, never sent.
//
// Workers run with every signal blocked: SG_IO on sg sleeps interruptibly, and a signal would
// orphan the command (sg.c: SG_IO returns -EINTR and the command runs on unseen).
#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <iterator>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>

#include "blkfence/assert.h"

#include "transport_impl.h"
#include "wakeup.h"

namespace blkfence::transport {
namespace detail {
namespace {

// Each SG_IO in flight on /dev/sgN holds one of the fd's 16 request slots (sg.c: SG_MAX_QUEUE),
// stuck ones included; with at most 16 per path no SG_IO ever fails with EDOM.
constexpr std::size_t kPerPathMax = kSgQueueDepth;
// The workers kept free for the paths that answer (SgioOptions::threads), and the workers in all,
// those stuck in SG_IO past their command's deadline included.
constexpr std::size_t kThreadsMax = 16;
constexpr std::size_t kWorkersMax = 64;
constexpr std::size_t kQueueMax = 4096;

// A path's fd, shared by the transport and the jobs on it: closed after the last one returns.
struct PathFd {
  PathFd(std::string path_name, UniqueFd path_fd)
      : name(std::move(path_name)), fd(std::move(path_fd)) {}
  std::string name;
  UniqueFd fd;
};

enum class JobState : std::uint8_t {
  kQueued,   // in Pool::queue
  kRunning,  // a worker is in sg_io() with it
  kDone,     // on Pool::done, result set
  kDropped,  // the caller has its completion already; the worker discards the result
};

struct Job {
  Job(Command command, std::int32_t pack_id, Clock::time_point now, std::uint64_t job_id,
      PathId path_id, std::shared_ptr<const PathFd> path_fd)
      : request(std::move(command), pack_id, now),
        submitted(now),
        id(job_id),
        path(path_id),
        fd(std::move(path_fd)) {}

  SgRequest request;
  const Clock::time_point submitted;
  const std::uint64_t id;
  const PathId path;
  const std::shared_ptr<const PathFd> fd;
  // Guarded by Pool::mutex.
  JobState state = JobState::kQueued;
  std::optional<Clock::time_point> started;  // when a worker took it: sg's timeout runs from here
  int result = 0;                            // what sg_io() returned: 0 or -errno
};

struct Pool {
  Pool(SgIoFunction function, Wakeup pool_wakeup, std::size_t per_path)
      : sg_io(std::move(function)), wakeup(std::move(pool_wakeup)), per_path_max(per_path) {}

  const SgIoFunction sg_io;
  Wakeup wakeup;  // workers only call notify()
  const std::size_t per_path_max;

  std::mutex mutex;
  std::condition_variable work_cv;  // a job was queued, or stopping
  std::condition_variable done_cv;  // a job finished, or a worker exited
  // Guarded by mutex.
  std::deque<std::shared_ptr<Job>> queue;
  std::vector<std::shared_ptr<Job>> done;
  std::vector<bool> exited;                          // per worker
  std::size_t busy = 0;                              // workers inside sg_io()
  std::size_t zombies = 0;                           // of those, the ones whose job is kDropped
  std::unordered_map<PathId, std::size_t> in_sg_io;  // workers inside sg_io() per path
  bool stopping = false;

  // The oldest queued job whose path may take another worker. mutex held.
  std::deque<std::shared_ptr<Job>>::iterator runnable() {
    return std::find_if(queue.begin(), queue.end(), [this](const std::shared_ptr<Job>& job) {
      const auto it = in_sg_io.find(job->path);
      return it == in_sg_io.end() || it->second < per_path_max;
    });
  }
};

void run_worker(const std::shared_ptr<Pool>& pool, std::size_t index) {
  std::unique_lock lock(pool->mutex);
  for (;;) {
    pool->work_cv.wait(lock,
                       [&pool] { return pool->stopping || pool->runnable() != pool->queue.end(); });
    if (pool->stopping) {
      break;
    }
    const auto next = pool->runnable();
    std::shared_ptr<Job> job = std::move(*next);
    pool->queue.erase(next);
    job->state = JobState::kRunning;
    job->started = Clock::now();
    ++pool->busy;
    ++pool->in_sg_io[job->path];
    lock.unlock();
    const int result = pool->sg_io(job->fd->fd.get(), job->request.header());
    lock.lock();
    job->result = result;
    const PathId path = job->path;
    if (job->state == JobState::kRunning) {
      job->state = JobState::kDone;
      pool->done.push_back(std::move(job));
      pool->wakeup.notify();
    } else {
      // kDropped: the caller had kIndeterminate already. Its buffers, and maybe its path's fd, go
      // now, before busy says this worker is free.
      job.reset();
      --pool->zombies;
    }
    --pool->busy;
    if (--pool->in_sg_io[path] == 0) {
      pool->in_sg_io.erase(path);
    }
    // The path may take a worker again: another worker may be waiting for that.
    pool->work_cv.notify_all();
    pool->done_cv.notify_all();
  }
  pool->exited[index] = true;
  pool->done_cv.notify_all();
}

class SgioTransport final : public TransportImpl {
 public:
  SgioTransport(const SgioOptions& options, std::shared_ptr<Pool> pool)
      : options_(options), pool_(std::move(pool)) {}

  ~SgioTransport() override {
    std::vector<bool> exited;
    {
      std::unique_lock lock(pool_->mutex);
      pool_->stopping = true;
      pool_->queue.clear();
      pool_->work_cv.notify_all();
      // Every worker either exits or is stuck in sg_io(); the stuck ones are left to finish alone.
      pool_->done_cv.wait(lock, [this] {
        const auto count = std::count(pool_->exited.begin(), pool_->exited.end(), true);
        return static_cast<std::size_t>(count) + pool_->busy == threads_.size();
      });
      exited = pool_->exited;
    }
    for (std::size_t i = 0; i < threads_.size(); ++i) {
      if (exited[i]) {
        threads_[i].join();  // returns at once: it has left run_worker()
      } else {
        threads_[i].detach();  // holds the Pool and its Job; drops both when SG_IO returns
      }
    }
  }

  // Starts the workers.
  [[nodiscard]] Result<void> start(std::size_t threads) {
    std::lock_guard lock(pool_->mutex);
    for (std::size_t i = 0; i < threads; ++i) {
      if (auto spawned = spawn(); !spawned) {
        return spawned;
      }
    }
    return {};
  }

  Result<PathId> open_path(const std::string& device) override {
    auto opened = open_device(device);
    if (!opened) {
      return tl::unexpected(opened.error());
    }
    return open_path_fd(std::move(opened->fd), device);
  }

  Result<PathId> open_path_fd(UniqueFd fd, std::string name) override {
    BLKFENCE_ASSERT(fd.valid());
    const PathId id = next_path_id_++;
    paths_.emplace(id, std::make_shared<const PathFd>(std::move(name), std::move(fd)));
    return id;
  }

  std::optional<DeviceNumber> device_of(PathId path_id) const override {
    const auto it = paths_.find(path_id);
    return it == paths_.end() ? std::nullopt : device_number_of(it->second->fd.get());
  }

  void close_path(PathId path_id) override {
    if (paths_.erase(path_id) == 0) {
      return;  // running jobs still hold the fd; it closes after the last one returns
    }
    std::unique_lock lock(pool_->mutex);
    const auto now = Clock::now();
    collect_done(now);  // what has finished completes with its real answer
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& job = *it->second;
      if (job.path != path_id) {
        ++it;
        continue;
      }
      if (job.state == JobState::kQueued) {
        unqueue(job);
        ready_.push_back(job.request.unanswered(Outcome::kOsError, ECANCELED, now));
      } else {
        job.state = JobState::kDropped;
        ++pool_->zombies;
        ready_.push_back(job.request.unanswered(Outcome::kIndeterminate, 0, now));
      }
      it = jobs_.erase(it);
    }
    replace_zombies();
    arm_wakeup();
    pool_->wakeup.notify();  // completions are ready without a worker's signal
  }

  Result<void> submit(PathId path_id, Command command) override {
    const auto path = paths_.find(path_id);
    if (path == paths_.end()) {
      return fail(ErrorCode::kInvalidArgument,
                  "submit: path " + std::to_string(path_id) + " is not open");
    }
    if (auto checked = check_command(command); !checked) {
      return checked;
    }
    std::unique_lock lock(pool_->mutex);
    if (pool_->queue.size() >= kQueueMax) {
      return tl::unexpected(Error::os(
          EAGAIN, path->second->name + ": " + std::to_string(kQueueMax) + " commands queued"));
    }
    const std::uint64_t id = next_job_id_++;
    auto job = std::make_shared<Job>(std::move(command), static_cast<std::int32_t>(id & 0x7fffffff),
                                     Clock::now(), id, path_id, path->second);
    jobs_.emplace(id, job);
    pool_->queue.push_back(std::move(job));
    pool_->work_cv.notify_one();
    arm_wakeup();
    return {};
  }

  Result<std::size_t> reap(std::chrono::milliseconds wait, std::vector<Completion>& out) override {
    const auto end = Clock::now() + std::max(wait, std::chrono::milliseconds(0));
    pool_->wakeup.drain();
    std::unique_lock lock(pool_->mutex);
    for (;;) {
      const auto now = Clock::now();
      collect_done(now);
      expire(now);
      if (!ready_.empty() || now >= end) {
        break;
      }
      pool_->done_cv.wait_until(lock, std::min(end, earliest_deadline().value_or(end)));
    }
    const std::size_t count = ready_.size();
    std::move(ready_.begin(), ready_.end(), std::back_inserter(out));
    ready_.clear();
    arm_wakeup();
    return count;
  }

  std::size_t in_flight() const override { return jobs_.size() + ready_.size(); }
  int poll_fd() const override { return pool_->wakeup.poll_fd(); }
  std::string_view name() const override { return "sg_io"; }

  std::size_t zombie_count() const override {
    std::lock_guard lock(pool_->mutex);
    const auto running = std::count_if(jobs_.begin(), jobs_.end(), [](const auto& job) {
      return job.second->state == JobState::kRunning;
    });
    return pool_->busy - static_cast<std::size_t>(running);
  }

 private:
  // The job's deadline: from submit() while it waits for a worker, from its start once running
  // (sg's own timeout starts with the SG_IO). Pool::mutex held.
  Clock::time_point deadline(const Job& job) const {
    return job.started.value_or(job.submitted) + job.request.timeout() + options_.deadline_grace;
  }

  // Pool::mutex held.
  std::optional<Clock::time_point> earliest_deadline() const {
    std::optional<Clock::time_point> earliest;
    for (const auto& [id, job] : jobs_) {
      const auto at = deadline(*job);
      if (!earliest || at < *earliest) {
        earliest = at;
      }
    }
    return earliest;
  }

  // Pool::mutex held.
  void arm_wakeup() { pool_->wakeup.arm(earliest_deadline()); }

  // Pool::mutex held.
  void unqueue(const Job& job) {
    auto& queue = pool_->queue;
    const auto it =
        std::find_if(queue.begin(), queue.end(), [&job](const auto& q) { return q.get() == &job; });
    BLKFENCE_ASSERT(it != queue.end());
    queue.erase(it);
  }

  // Turns what the workers finished into completions. Pool::mutex held.
  void collect_done(Clock::time_point now) {
    for (const std::shared_ptr<Job>& job : pool_->done) {
      BLKFENCE_ASSERT(job->state == JobState::kDone);
      if (jobs_.erase(job->id) == 0) {
        continue;  // its path was closed meanwhile and the caller was told
      }
      if (job->result == 0) {
        ready_.push_back(job->request.answered(job->request.header(), now));
      } else {
        // SG_IO fails before issuing the command (EPERM from the CAP_SYS_RAWIO filter, ENXIO for
        // an offline device, EDOM, EINVAL...) except when a signal interrupts the wait, which
        // orphans a command that was already issued.
        const int error_number = -job->result;
        const SgAnswer answer{.os_errno = error_number, .may_have_executed = error_number == EINTR};
        ready_.push_back(job->request.unanswered(classify(answer), error_number, now));
      }
    }
    pool_->done.clear();
  }

  // Pool::mutex held.
  void expire(Clock::time_point now) {
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Job& job = *it->second;
      if (deadline(job) > now) {
        ++it;
        continue;
      }
      if (job.state == JobState::kQueued) {
        // No worker was free all along (every one stuck in SG_IO): it was never sent.
        unqueue(job);
        ready_.push_back(job.request.unanswered(Outcome::kOsError, ETIMEDOUT, now));
      } else {
        BLKFENCE_ASSERT(job.state == JobState::kRunning);
        job.state = JobState::kDropped;  // the worker drops its result when SG_IO returns
        ++pool_->zombies;
        ready_.push_back(job.request.unanswered(Outcome::kIndeterminate, 0, now));
      }
      it = jobs_.erase(it);
    }
    replace_zombies();
  }

  // Starts a worker with every signal blocked (it inherits the mask). Pool::mutex held: the worker
  // waits for it before it looks at the queue.
  [[nodiscard]] Result<void> spawn() {
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    Result<void> spawned;
    pool_->exited.push_back(false);
    try {
      threads_.emplace_back(run_worker, pool_, threads_.size());
    } catch (const std::system_error& error) {
      // std::thread reports a failed pthread_create() only by throwing.
      pool_->exited.pop_back();
      spawned = tl::unexpected(Error::os(error.code().value(), "starting an SG_IO worker thread"));
    }
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return spawned;
  }

  // Keeps options_.threads workers free of stuck SG_IOs, as far as kWorkersMax allows: each one
  // stuck past its deadline gets a new worker beside it. A worker whose SG_IO comes back stays
  // (the pool does not shrink): a path that keeps hanging grows it only while more are stuck at
  // once than ever before. Pool::mutex held.
  void replace_zombies() {
    while (threads_.size() - pool_->zombies < options_.threads && threads_.size() < kWorkersMax) {
      if (!spawn()) {
        return;  // the workers there are carry on; the next expiry tries again
      }
    }
  }

  SgioOptions options_;
  std::shared_ptr<Pool> pool_;
  std::vector<std::thread> threads_;
  std::unordered_map<PathId, std::shared_ptr<const PathFd>> paths_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Job>> jobs_;  // submitted, not yet completed
  std::vector<Completion> ready_;
  PathId next_path_id_ = 1;
  std::uint64_t next_job_id_ = 1;
};

}  // namespace

int sg_io_ioctl(int fd, sg_io_hdr& header) {
  return ::ioctl(fd, SG_IO, &header) == 0 ? 0 : -errno;
}

Result<std::unique_ptr<TransportImpl>> make_sgio_transport(const SgioOptions& options) {
  if (options.threads == 0 || options.threads > kThreadsMax) {
    return fail(ErrorCode::kInvalidArgument, "SG_IO transport: " + std::to_string(options.threads) +
                                                 " threads (1 to " + std::to_string(kThreadsMax) +
                                                 ")");
  }
  if (options.per_path_max == 0 || options.per_path_max > kPerPathMax) {
    return fail(ErrorCode::kInvalidArgument,
                "SG_IO transport: " + std::to_string(options.per_path_max) +
                    " workers per path (1 to 16: each SG_IO in flight holds one of an sg fd's 16 "
                    "slots)");
  }
  BLKFENCE_ASSERT(options.sg_io != nullptr);
  auto wakeup = Wakeup::make();
  if (!wakeup) {
    return tl::unexpected(wakeup.error());
  }
  auto pool = std::make_shared<Pool>(options.sg_io, std::move(*wakeup), options.per_path_max);
  auto transport = std::make_unique<SgioTransport>(options, std::move(pool));
  if (auto started = transport->start(options.threads); !started) {
    return tl::unexpected(started.error());
  }
  return transport;
}

}  // namespace detail

Result<std::unique_ptr<Transport>> make_sgio_transport(std::size_t threads) {
  detail::SgioOptions options;
  options.threads = threads;
  auto transport = detail::make_sgio_transport(options);
  if (!transport) {
    return tl::unexpected(transport.error());
  }
  return std::unique_ptr<Transport>(std::move(*transport));
}

}  // namespace blkfence::transport

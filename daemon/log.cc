// Structured logging to the journal or stderr, written by a thread of its own (daemon layer). See
// log.h.
#include "log.h"

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>

#include "blkfence/key.h"

namespace blkfence::daemon {
namespace {

// Set on the caller's thread, read on the writer's.
std::atomic<LogTarget> g_target{LogTarget::kAuto};
std::atomic<bool> g_debug{false};

bool use_journal() {
  LogTarget target = g_target;
  if (target == LogTarget::kAuto) {
    // systemd sets JOURNAL_STREAM when stderr is connected to the journal (systemd.exec(5)).
    target = std::getenv("JOURNAL_STREAM") != nullptr ? LogTarget::kJournal : LogTarget::kStderr;
  }
  return target == LogTarget::kJournal;
}

// A record waiting for the writer: its own copies of the fields, and the time log() was called.
struct Record {
  Priority priority = Priority::kInfo;
  std::string message;
  std::string resource;
  std::optional<std::uint64_t> key;
  std::optional<std::uint32_t> epoch;
  std::string device;
  std::string message_id;
  timespec stamp{};
  // Records dropped right after this one (the queue was full): reported after it is written.
  std::uint64_t dropped_after = 0;

  LogFields fields() const {
    return LogFields{.resource = resource,
                     .key = key,
                     .epoch = epoch,
                     .device = device,
                     .message_id = message_id};
  }
};

void write_journal(const Record& record) {
  std::vector<std::string> entries{"MESSAGE=" + record.message,
                                   "PRIORITY=" + std::to_string(static_cast<int>(record.priority)),
                                   "SYSLOG_IDENTIFIER=blkfenced"};
  if (!record.resource.empty()) {
    entries.push_back("BLKFENCE_RESOURCE=" + record.resource);
  }
  if (record.key) {
    entries.push_back("BLKFENCE_KEY=" + fence::Key::format(*record.key));
  }
  if (record.epoch) {
    entries.push_back("BLKFENCE_EPOCH=" + std::to_string(*record.epoch));
  }
  if (!record.device.empty()) {
    entries.push_back("BLKFENCE_DEVICE=" + record.device);
  }
  if (!record.message_id.empty()) {
    entries.push_back("MESSAGE_ID=" + record.message_id);
  }
  std::vector<iovec> vectors;
  vectors.reserve(entries.size());
  for (auto& entry : entries) {
    vectors.push_back(iovec{.iov_base = entry.data(), .iov_len = entry.size()});
  }
  (void)sd_journal_sendv(vectors.data(), static_cast<int>(vectors.size()));
}

void write_stderr(const Record& record) {
  std::string line = record.message;
  if (!record.resource.empty()) {
    line += " resource=" + record.resource;
  }
  if (record.key) {
    line += " key=" + fence::Key::format(*record.key);
  }
  if (record.epoch) {
    line += " epoch=" + std::to_string(*record.epoch);
  }
  if (!record.device.empty()) {
    line += " device=" + record.device;
  }
  if (!record.message_id.empty()) {
    line += " message_id=" + record.message_id;
  }
  // sd-daemon(3) priority prefix, then the wall-clock time of the log() call (CLOCK_REALTIME, as
  // bash's EPOCHREALTIME), so that lab checks can time events against their own actions.
  (void)std::fprintf(stderr, "<%d>[%lld.%06ld] %s\n", static_cast<int>(record.priority),
                     static_cast<long long>(record.stamp.tv_sec), record.stamp.tv_nsec / 1000,
                     line.c_str());
}

// The queue between log() and the writer thread. Never destroyed: the thread is detached and may
// still be writing while the process exits.
class Writer {
 public:
  static Writer& get() {
    static Writer* const kWriter = new Writer();
    return *kWriter;
  }

  void push(Record record) {
    {
      const std::lock_guard lock(mutex_);
      start();
      if (queue_.size() >= kLogQueueMax) {
        ++queue_.back().dropped_after;
        ++dropped_;
        return;
      }
      queue_.push_back(std::move(record));
    }
    wake_.notify_one();
  }

  bool flush(std::chrono::milliseconds wait) {
    std::unique_lock lock(mutex_);
    return idle_.wait_for(lock, wait, [this] { return queue_.empty() && !writing_; });
  }

  std::uint64_t dropped() const {
    const std::lock_guard lock(mutex_);
    return dropped_;
  }

  void set_sink(LogSink sink) {
    const std::lock_guard lock(mutex_);
    sink_ = std::move(sink);
  }

 private:
  Writer() = default;

  // Under mutex_.
  void start() {
    if (started_) {
      return;
    }
    started_ = true;
    std::thread([this] { loop(); }).detach();
  }

  void loop() {
    // Signals are for the event loop's signalfd; none may be delivered here.
    sigset_t all;
    sigfillset(&all);
    (void)pthread_sigmask(SIG_BLOCK, &all, nullptr);
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return !queue_.empty(); });
      Record record = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      LogSink sink = sink_;
      lock.unlock();
      write(sink, record);
      if (record.dropped_after > 0) {
        Record report{.priority = Priority::kWarning,
                      .message = std::to_string(record.dropped_after) +
                                 " log record(s) dropped here: the journal or stderr did not take "
                                 "them fast enough (blkfence_log_dropped_total counts them all)",
                      .resource = {},
                      .key = std::nullopt,
                      .epoch = std::nullopt,
                      .device = {},
                      .message_id = {},
                      .stamp = record.stamp,
                      .dropped_after = 0};
        write(sink, report);
      }
      lock.lock();
      writing_ = false;
      if (queue_.empty()) {
        idle_.notify_all();
      }
    }
  }

  static void write(const LogSink& sink, const Record& record) {
    if (sink) {
      sink(record.priority, record.message, record.fields());
    } else if (use_journal()) {
      write_journal(record);
    } else {
      write_stderr(record);
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Record> queue_;
  bool started_ = false;
  bool writing_ = false;
  std::uint64_t dropped_ = 0;
  LogSink sink_;  // tests only
};

}  // namespace

void set_log_target(LogTarget target) {
  g_target = target;
}
void set_log_debug(bool debug) {
  g_debug = debug;
}
void set_log_sink_for_testing(LogSink sink) {
  Writer::get().set_sink(std::move(sink));
}

void log(Priority priority, const std::string& message, const LogFields& fields) {
  if (priority == Priority::kDebug && !g_debug) {
    return;
  }
  Record record{.priority = priority,
                .message = message,
                .resource = fields.resource,
                .key = fields.key,
                .epoch = fields.epoch,
                .device = fields.device,
                .message_id = std::string(fields.message_id),
                .stamp = {},
                .dropped_after = 0};
  (void)clock_gettime(CLOCK_REALTIME, &record.stamp);
  Writer::get().push(std::move(record));
}

bool flush_log(std::chrono::milliseconds wait) {
  return Writer::get().flush(wait);
}

std::uint64_t log_dropped() {
  return Writer::get().dropped();
}

}  // namespace blkfence::daemon

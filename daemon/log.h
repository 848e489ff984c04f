// blkfenced's one logging boundary: structured journal records (daemon layer).
//
// docs/design.md §6: every record about a resource carries BLKFENCE_RESOURCE, and where they apply
// BLKFENCE_KEY, BLKFENCE_EPOCH and BLKFENCE_DEVICE; the protocol's events carry a MESSAGE_ID so
// that `journalctl MESSAGE_ID=...` finds every fence of a cluster. Under systemd (JOURNAL_STREAM
// set, or --journal) records go to the journal with their fields; otherwise (a shell, the lab VM)
// one line to stderr with the fields appended.
//
// log() never waits for the journal or stderr: a stalled journald or a full stderr pipe must not
// stop the event loop (the monitor's checks, the lease). It copies the record into a bounded queue
// (kLogQueueMax records) that a thread of its own writes out in order. When the queue is full the
// record is dropped and counted (log_dropped(), the metric blkfence_log_dropped_total), and a
// warning with the count is written where the records went missing. flush_log() waits, bounded,
// for the queue to be written, on the way out. Thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace blkfence::daemon {

enum class Priority : std::uint8_t { kErr = 3, kWarning = 4, kNotice = 5, kInfo = 6, kDebug = 7 };

// MESSAGE_IDs, generated once with `systemd-id128 new`; documented in docs/operations.md.
inline constexpr std::string_view kMessageAcquired = "5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a11";
inline constexpr std::string_view kMessageReleased = "5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a12";
inline constexpr std::string_view kMessageFenced = "5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a13";
inline constexpr std::string_view kMessageLostContact = "5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a14";
inline constexpr std::string_view kMessageContactRestored = "5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a15";
inline constexpr std::string_view kMessageUnfenced = "5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a16";
inline constexpr std::string_view kMessageFencedNode = "5c0a3b5e4f8d4e5b9a1e6c2d7f0b9a17";

struct LogFields {
  std::string resource;
  std::optional<std::uint64_t> key;
  std::optional<std::uint32_t> epoch;
  std::string device;
  std::string_view message_id;
};

enum class LogTarget : std::uint8_t { kAuto, kJournal, kStderr };
void set_log_target(LogTarget target);
void set_log_debug(bool debug);

inline constexpr std::size_t kLogQueueMax = 1024;

void log(Priority priority, const std::string& message, const LogFields& fields = {});

// Waits until every record logged so far is written, at most wait; whether they were.
bool flush_log(std::chrono::milliseconds wait);
// Records dropped because the queue was full, since the process started.
[[nodiscard]] std::uint64_t log_dropped();

// Tests only: while a sink is set, the writer thread hands every record to it, in order, instead
// of writing it to the journal or stderr, so that a test can see what was logged, with which
// fields, and what happens while the writing is stalled. Empty restores.
using LogSink = std::function<void(Priority, const std::string&, const LogFields&)>;
void set_log_sink_for_testing(LogSink sink);

}  // namespace blkfence::daemon

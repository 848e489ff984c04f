// Structured logging to the journal or stderr (daemon layer). See log.h.
#include "log.h"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include <sys/uio.h>
#include <systemd/sd-journal.h>

#include "blkfence/key.h"

namespace blkfence::daemon {
namespace {

LogTarget g_target = LogTarget::kAuto;
bool g_debug = false;
LogSink g_sink;  // tests only

bool use_journal() {
  if (g_target == LogTarget::kAuto) {
    // systemd sets JOURNAL_STREAM when stderr is connected to the journal (systemd.exec(5)).
    g_target = std::getenv("JOURNAL_STREAM") != nullptr ? LogTarget::kJournal : LogTarget::kStderr;
  }
  return g_target == LogTarget::kJournal;
}

}  // namespace

void set_log_target(LogTarget target) {
  g_target = target;
}
void set_log_debug(bool debug) {
  g_debug = debug;
}
void set_log_sink_for_testing(LogSink sink) {
  g_sink = std::move(sink);
}

void log(Priority priority, const std::string& message, const LogFields& fields) {
  if (g_sink) {
    g_sink(priority, message, fields);
    return;
  }
  if (priority == Priority::kDebug && !g_debug) {
    return;
  }
  if (use_journal()) {
    std::vector<std::string> entries{"MESSAGE=" + message,
                                     "PRIORITY=" + std::to_string(static_cast<int>(priority)),
                                     "SYSLOG_IDENTIFIER=blkfenced"};
    if (!fields.resource.empty()) {
      entries.push_back("BLKFENCE_RESOURCE=" + fields.resource);
    }
    if (fields.key) {
      entries.push_back("BLKFENCE_KEY=" + fence::Key::format(*fields.key));
    }
    if (fields.epoch) {
      entries.push_back("BLKFENCE_EPOCH=" + std::to_string(*fields.epoch));
    }
    if (!fields.device.empty()) {
      entries.push_back("BLKFENCE_DEVICE=" + fields.device);
    }
    if (!fields.message_id.empty()) {
      entries.push_back("MESSAGE_ID=" + std::string(fields.message_id));
    }
    std::vector<iovec> vectors;
    vectors.reserve(entries.size());
    for (auto& entry : entries) {
      vectors.push_back(iovec{.iov_base = entry.data(), .iov_len = entry.size()});
    }
    (void)sd_journal_sendv(vectors.data(), static_cast<int>(vectors.size()));
    return;
  }
  std::string line = message;
  if (!fields.resource.empty()) {
    line += " resource=" + fields.resource;
  }
  if (fields.key) {
    line += " key=" + fence::Key::format(*fields.key);
  }
  if (fields.epoch) {
    line += " epoch=" + std::to_string(*fields.epoch);
  }
  if (!fields.device.empty()) {
    line += " device=" + fields.device;
  }
  if (!fields.message_id.empty()) {
    line += " message_id=" + std::string(fields.message_id);
  }
  // sd-daemon(3) priority prefix, then the wall-clock time (CLOCK_REALTIME, as bash's
  // EPOCHREALTIME), so that lab checks can time events against their own actions.
  timespec now{};
  (void)clock_gettime(CLOCK_REALTIME, &now);
  (void)std::fprintf(stderr, "<%d>[%lld.%06ld] %s\n", static_cast<int>(priority),
                     static_cast<long long>(now.tv_sec), now.tv_nsec / 1000, line.c_str());
}

}  // namespace blkfence::daemon

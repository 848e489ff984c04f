// The control socket's transport: a listening unix stream socket, its clients, their line buffers,
// limits and peer credentials (daemon layer).
//
// docs/control-protocol.md, "Limits": one JSON object per line, at most kMaxLineSize bytes. No
// local user can take the socket from the peers that run operations: of kMaxClients places,
// kReservedPrivileged are kept for privileged peers (root, or whoever the handler says may change
// state), and one uid other than root holds at most kMaxPerUid; a refused client is told "busy"
// and closed. A client that leaves a partial line unfinished for partial_line_timeout, or sits
// silent for idle_timeout while it is owed nothing, is dropped; so is one whose unread output
// passes kMaxQueued (a `watch` that stopped reading). One wake-up of a client reads at most
// kReadBudget bytes and handles at most kLineBudget lines, so a fast client cannot starve the
// loop. When accept(2) fails for want of file descriptors (EMFILE, ENFILE), the listening socket
// is left alone for accept_pause instead of being retried on every loop iteration. None of that
// can stall the daemon: every socket is non-blocking and serviced by sd-event. SO_PEERCRED and
// SO_PEERGROUPS are read at accept and handed to the handler with each request; what a peer may
// do is the handler's decision. Logs once per condition (log.h), at the daemon's boundary.
// One thread (the daemon's event loop).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <sys/types.h>

#include "blkfence/control/protocol.h"
#include "blkfence/error.h"
#include "blkfence/unique_fd.h"

struct sd_event;
struct sd_event_source;

namespace blkfence::daemon {

struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary
};

using ClientId = std::uint64_t;

class ControlHandler {
 public:
  virtual ~ControlHandler() = default;
  // One complete line (without '\n'), or a line that was too long (too_large, line empty).
  virtual void on_line(ClientId client, const Peer& peer, std::string_view line,
                       bool too_large) = 0;
  virtual void on_disconnect(ClientId client) = 0;
  // Whether peer may use the places kept for privileged peers (asked once, at accept).
  virtual bool privileged(const Peer& peer) = 0;
};

// The timeouts, apart so that tests can shorten them.
struct ControlTimeouts {
  std::chrono::milliseconds partial_line = control::kPartialLineTimeout;
  std::chrono::milliseconds idle{30'000};
  std::chrono::milliseconds accept_pause{1'000};
};

// What the server has refused or dropped since it started, for tests and metrics.
struct ControlCounters {
  std::uint64_t refused_busy = 0;     // every place a peer may take was taken
  std::uint64_t refused_per_uid = 0;  // its uid held kMaxPerUid connections
  std::uint64_t dropped_partial_line = 0;
  std::uint64_t dropped_idle = 0;
  std::uint64_t dropped_unread = 0;    // output beyond kMaxQueued
  std::uint64_t accept_failures = 0;   // accept(2) calls that failed with a resource shortage
  std::uint64_t accept_shortages = 0;  // such failures logged (at most one per kLogInterval)
};

class ControlServer {
 public:
  // The limits docs/control-protocol.md documents, as the protocol's header states them.
  static constexpr std::size_t kMaxLineSize = control::kMaxRequestSize;
  static constexpr std::size_t kMaxClients = control::kMaxClients;
  static constexpr std::size_t kReservedPrivileged = 8;
  static constexpr std::size_t kMaxPerUid = 16;
  static constexpr std::size_t kMaxQueued = 1024 * 1024;
  static constexpr std::size_t kReadBudget = 64 * 1024;
  static constexpr std::size_t kLineBudget = 16;
  static constexpr std::chrono::seconds kLogInterval{10};

  // Binds path (replacing a stale socket), mode 0666: everyone may connect and read status.
  [[nodiscard]] static Result<std::unique_ptr<ControlServer>> make(sd_event* event,
                                                                   const std::string& path,
                                                                   ControlHandler& handler,
                                                                   ControlTimeouts timeouts = {});
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Queues a line (with its '\n') for a client; a client gone or over kMaxQueued is closed.
  void send(ClientId client, const std::string& line);
  // Closes after what is queued has been written (or at once when the peer is gone).
  void close_after_send(ClientId client);
  // The handler owes this client an answer, or streams events to it: the idle timeout does not
  // apply until as many release_hold() calls have come (holds nest: one per request).
  void hold(ClientId client);
  void release_hold(ClientId client);
  std::size_t client_count() const { return clients_.size(); }
  const ControlCounters& counters() const { return counters_; }

 private:
  struct Client;
  enum class Why : std::uint8_t { kGone, kPartialLine, kIdle, kUnread };
  ControlServer(sd_event* event, ControlHandler& handler, ControlTimeouts timeouts);
  static int on_accept(sd_event_source* source, int fd, std::uint32_t revents, void* self);
  static int on_accept_pause_end(sd_event_source* source, std::uint64_t usec, void* self);
  static int on_client_io(sd_event_source* source, int fd, std::uint32_t revents, void* client);
  static int on_timeout(sd_event_source* source, std::uint64_t usec, void* client);
  void accept_some();
  void pause_accept(int error);
  bool admit(UniqueFd& fd, const Peer& peer, bool privileged);
  void serve(Client& client);
  bool handle_lines(Client& client, std::size_t& lines);
  void write_to(Client& client);
  void drop(ClientId id, Why why);
  void update_events(Client& client);
  void update_timer(Client& client);

  sd_event* event_;
  ControlHandler& handler_;
  ControlTimeouts timeouts_;
  UniqueFd listen_fd_;
  sd_event_source* listen_source_ = nullptr;
  sd_event_source* accept_pause_ = nullptr;
  bool accept_failing_ = false;  // a shortage was logged: log the first accept after it
  // What a peer can make happen again and again (refusals, drops for unread output) is logged at
  // most once per kLogInterval, with how many times it happened.
  struct LogLimit {
    std::uint64_t logged_usec = 0;
    std::uint64_t unlogged = 0;
    // The count to log now, or 0 to stay silent.
    std::uint64_t due(sd_event* event);
  };
  LogLimit refusal_log_;
  LogLimit unread_log_;
  LogLimit accept_log_;
  ControlCounters counters_;
  std::string path_;
  ClientId next_id_ = 1;
  std::map<ClientId, std::unique_ptr<Client>> clients_;
};

}  // namespace blkfence::daemon

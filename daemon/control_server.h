// The control socket's transport: a listening unix stream socket, its clients, their line buffers,
// limits and peer credentials (daemon layer).
//
// docs/control-protocol.md: one JSON object per line, at most kMaxLineSize bytes; at most
// kMaxClients at once (more are told "busy" and closed); a client that leaves a partial line
// unfinished for kIdleTimeout is dropped; a client whose unread replies pile beyond kMaxQueued
// (a `watch` that stopped reading) is dropped. None of that can stall the daemon: every socket is
// non-blocking and serviced by sd-event. SO_PEERCRED and SO_PEERGROUPS are read at accept and
// handed to the handler with each request; what a peer may do is the handler's decision.
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
};

class ControlServer {
 public:
  // The limits docs/control-protocol.md documents, as the protocol's header states them.
  static constexpr std::size_t kMaxLineSize = control::kMaxRequestSize;
  static constexpr std::size_t kMaxClients = control::kMaxClients;
  static constexpr std::size_t kMaxQueued = 1024 * 1024;
  static constexpr std::chrono::milliseconds kIdleTimeout = control::kPartialLineTimeout;

  // Binds path (replacing a stale socket), mode 0666: everyone may connect and read status.
  // idle_timeout is kIdleTimeout but in tests.
  [[nodiscard]] static Result<std::unique_ptr<ControlServer>> make(
      sd_event* event, const std::string& path, ControlHandler& handler,
      std::chrono::milliseconds idle_timeout = kIdleTimeout);
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // Queues a line (with its '\n') for a client; a client gone or over kMaxQueued is closed.
  void send(ClientId client, const std::string& line);
  // Closes after what is queued has been written (or at once when the peer is gone).
  void close_after_send(ClientId client);
  std::size_t client_count() const { return clients_.size(); }

 private:
  struct Client;
  ControlServer(sd_event* event, ControlHandler& handler, std::chrono::milliseconds idle_timeout);
  static int on_accept(sd_event_source* source, int fd, std::uint32_t revents, void* self);
  static int on_client_io(sd_event_source* source, int fd, std::uint32_t revents, void* client);
  static int on_idle(sd_event_source* source, std::uint64_t usec, void* client);
  void accept_one();
  void read_from(Client& client);
  void write_to(Client& client);
  void drop(ClientId id);
  void update_events(Client& client);

  sd_event* event_;
  ControlHandler& handler_;
  std::chrono::milliseconds idle_timeout_;
  UniqueFd listen_fd_;
  sd_event_source* listen_source_ = nullptr;
  std::string path_;
  ClientId next_id_ = 1;
  std::map<ClientId, std::unique_ptr<Client>> clients_;
};

}  // namespace blkfence::daemon

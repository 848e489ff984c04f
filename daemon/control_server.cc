// The control socket's transport (daemon layer). See control_server.h.
#include "control_server.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "log.h"

namespace blkfence::daemon {
namespace {

// Connections accepted per wake-up of the listening socket: a burst of connects waits its turn
// behind the clients already served, as their lines do (kLineBudget).
constexpr std::size_t kAcceptBudget = 16;

std::uint64_t usec_after(sd_event* event, std::chrono::milliseconds delay) {
  std::uint64_t now = 0;
  (void)sd_event_now(event, CLOCK_MONOTONIC, &now);
  return now + static_cast<std::uint64_t>(std::chrono::microseconds(delay).count());
}

std::string who(const Peer& peer) {
  return "pid " + std::to_string(peer.pid) + ", uid " + std::to_string(peer.uid);
}

}  // namespace

std::uint64_t ControlServer::LogLimit::due(sd_event* event) {
  std::uint64_t now = 0;
  (void)sd_event_now(event, CLOCK_MONOTONIC, &now);
  ++unlogged;
  const auto interval = static_cast<std::uint64_t>(std::chrono::microseconds(kLogInterval).count());
  if (logged_usec != 0 && now - logged_usec < interval) {
    return 0;
  }
  logged_usec = now;
  return std::exchange(unlogged, 0);
}

struct ControlServer::Client {
  enum class Clock : std::uint8_t { kNone, kPartialLine, kIdle };

  ControlServer* server = nullptr;
  ClientId id = 0;
  UniqueFd fd;
  Peer peer;
  sd_event_source* io = nullptr;
  sd_event_source* timer = nullptr;  // the partial-line or the idle clock
  Clock clock = Clock::kNone;
  std::string in;
  std::string out;
  int holds = 0;
  bool discarding = false;  // inside a line that was too long: skip to its end
  bool closing = false;

  ~Client() {
    sd_event_source_disable_unref(io);
    sd_event_source_disable_unref(timer);
  }
};

ControlServer::ControlServer(sd_event* event, ControlHandler& handler, ControlTimeouts timeouts)
    : event_(event), handler_(handler), timeouts_(timeouts) {}

Result<std::unique_ptr<ControlServer>> ControlServer::make(sd_event* event, const std::string& path,
                                                           ControlHandler& handler,
                                                           ControlTimeouts timeouts) {
  std::unique_ptr<ControlServer> server(new ControlServer(event, handler, timeouts));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof address.sun_path) {
    return fail(ErrorCode::kInvalidArgument, path + ": too long for a unix socket path");
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  server->listen_fd_ = UniqueFd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!server->listen_fd_.valid()) {
    return tl::unexpected(Error::os(errno, "socket"));
  }
  (void)::unlink(path.c_str());  // a socket left by a previous run
  if (::bind(server->listen_fd_.get(), reinterpret_cast<const sockaddr*>(&address),
             sizeof address) != 0) {
    return tl::unexpected(Error::os(errno, "bind " + path));
  }
  if (::chmod(path.c_str(), 0666) != 0) {
    return tl::unexpected(Error::os(errno, "chmod " + path));
  }
  if (::listen(server->listen_fd_.get(), 64) != 0) {
    return tl::unexpected(Error::os(errno, "listen " + path));
  }
  server->path_ = path;
  int r = sd_event_add_io(event, &server->listen_source_, server->listen_fd_.get(), EPOLLIN,
                          &ControlServer::on_accept, server.get());
  if (r >= 0) {
    r = sd_event_add_time(event, &server->accept_pause_, CLOCK_MONOTONIC, UINT64_MAX, 0,
                          &ControlServer::on_accept_pause_end, server.get());
  }
  if (r >= 0) {
    r = sd_event_source_set_enabled(server->accept_pause_, SD_EVENT_OFF);
  }
  if (r < 0) {
    return tl::unexpected(Error::os(-r, "sd_event_add_io"));
  }
  return server;
}

ControlServer::~ControlServer() {
  clients_.clear();
  sd_event_source_disable_unref(listen_source_);
  sd_event_source_disable_unref(accept_pause_);
  if (!path_.empty()) {
    (void)::unlink(path_.c_str());
  }
}

int ControlServer::on_accept(sd_event_source*, int, std::uint32_t, void* self) {
  static_cast<ControlServer*>(self)->accept_some();
  return 0;
}

void ControlServer::accept_some() {
  for (std::size_t i = 0; i < kAcceptBudget; ++i) {
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        pause_accept(errno);
      }
      return;  // EAGAIN, or a client that vanished before we got to it
    }
    ucred credentials{};
    socklen_t size = sizeof credentials;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
      continue;
    }
    Peer peer{.pid = credentials.pid, .uid = credentials.uid, .gid = credentials.gid, .groups = {}};
    std::vector<gid_t> groups(64);
    socklen_t groups_size = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERGROUPS, groups.data(), &groups_size) == 0) {
      groups.resize(groups_size / sizeof(gid_t));
      peer.groups = std::move(groups);
    }
    (void)admit(fd, peer, handler_.privileged(peer));
  }
}

// EMFILE and ENFILE leave the connection in the listen backlog and the socket readable: retried
// at once, accept(2) would fail again on every loop iteration (a busy loop that starves the
// monitor). The socket is left alone for accept_pause instead; waiting clients stay queued in the
// backlog (or get ECONNREFUSED/EAGAIN from connect(2) once it is full).
void ControlServer::pause_accept(int error) {
  ++counters_.accept_failures;
  (void)sd_event_source_set_enabled(listen_source_, SD_EVENT_OFF);
  (void)sd_event_source_set_time(accept_pause_, usec_after(event_, timeouts_.accept_pause));
  (void)sd_event_source_set_enabled(accept_pause_, SD_EVENT_ONESHOT);
  // A shortage often flickers (a client closes, one accept succeeds, the next fails): logged at
  // most once per kLogInterval, with the failures counted.
  if (const auto count = accept_log_.due(event_)) {
    accept_failing_ = true;
    ++counters_.accept_shortages;
    log(Priority::kWarning,
        "cannot accept control connections on " + path_ + ": " + std::strerror(error) + " (" +
            std::to_string(count) + " time(s) since the last such message); retrying every " +
            std::to_string(timeouts_.accept_pause.count()) +
            " ms, clients wait meanwhile (raise LimitNOFILE, or find what holds the daemon's "
            "file descriptors: ls /proc/$(pidof blkfenced)/fd)");
  }
}

int ControlServer::on_accept_pause_end(sd_event_source*, std::uint64_t, void* self) {
  auto* server = static_cast<ControlServer*>(self);
  (void)sd_event_source_set_enabled(server->listen_source_, SD_EVENT_ON);
  return 0;
}

bool ControlServer::admit(UniqueFd& fd, const Peer& peer, bool privileged) {
  if (accept_failing_) {
    accept_failing_ = false;
    log(Priority::kNotice, "accepting control connections on " + path_ + " again");
  }
  const auto same_uid = static_cast<std::size_t>(
      std::count_if(clients_.begin(), clients_.end(),
                    [&](const auto& entry) { return entry.second->peer.uid == peer.uid; }));
  const std::size_t places = privileged ? kMaxClients : kMaxClients - kReservedPrivileged;
  std::string refusal;
  if (peer.uid != 0 && same_uid >= kMaxPerUid) {
    ++counters_.refused_per_uid;
    refusal = "too many connections from uid " + std::to_string(peer.uid) + " (at most " +
              std::to_string(kMaxPerUid) + " per user)";
  } else if (clients_.size() >= places) {
    ++counters_.refused_busy;
    refusal = "too many clients (" + std::to_string(clients_.size()) + " connected; " +
              std::to_string(kReservedPrivileged) + " of " + std::to_string(kMaxClients) +
              " places are kept for peers that may change state)";
  }
  if (!refusal.empty()) {
    const std::string line = control::encode_error(
        {.id = std::nullopt, .code = control::ReplyError::kBusy, .message = refusal});
    (void)::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (const auto count = refusal_log_.due(event_)) {
      log(Priority::kWarning, "refused " + std::to_string(count) +
                                  " control connection(s) since the last such message; the "
                                  "latest (" +
                                  who(peer) + "): " + refusal);
    }
    return false;
  }
  auto client = std::make_unique<Client>();
  client->server = this;
  client->id = next_id_++;
  client->peer = peer;
  client->fd = std::move(fd);
  if (sd_event_add_io(event_, &client->io, client->fd.get(), EPOLLIN, &ControlServer::on_client_io,
                      client.get()) < 0) {
    return false;
  }
  Client& admitted = *client;
  clients_.emplace(client->id, std::move(client));
  update_timer(admitted);
  return true;
}

int ControlServer::on_client_io(sd_event_source*, int, std::uint32_t revents, void* pointer) {
  auto* client = static_cast<Client*>(pointer);
  ControlServer* server = client->server;
  const ClientId id = client->id;
  if ((revents & EPOLLOUT) != 0U) {
    server->write_to(*client);
    if (!server->clients_.contains(id)) {
      return 0;
    }
  }
  if ((revents & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0U) {
    server->serve(*client);
  }
  return 0;
}

int ControlServer::on_timeout(sd_event_source*, std::uint64_t, void* pointer) {
  auto* client = static_cast<Client*>(pointer);
  client->server->drop(
      client->id, client->clock == Client::Clock::kPartialLine ? Why::kPartialLine : Why::kIdle);
  return 0;
}

// One wake-up's worth of a client: at most kLineBudget lines and kReadBudget bytes. Bytes are
// taken from the socket only up to the last line the budget allows (looked at with MSG_PEEK first):
// what is left stays in the socket, whose readiness (level-triggered) brings the client back on a
// later iteration, after the other clients and the transport's completions have had their turn.
void ControlServer::serve(Client& client) {
  const ClientId id = client.id;
  std::size_t lines = 0;
  std::size_t bytes = 0;
  char buffer[16 * 1024];
  while (lines < kLineBudget && bytes < kReadBudget) {
    const std::size_t size = std::min(sizeof buffer, kReadBudget - bytes);
    ssize_t got = ::recv(client.fd.get(), buffer, size, MSG_PEEK | MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
      drop(id, Why::kGone);
      return;
    }
    if (got < 0) {
      break;
    }
    std::size_t take = static_cast<std::size_t>(got);
    std::size_t newlines = lines;
    for (std::size_t i = 0; i < take; ++i) {
      if (buffer[i] == '\n' && ++newlines == kLineBudget) {
        take = i + 1;
        break;
      }
    }
    got = ::recv(client.fd.get(), buffer, take, MSG_DONTWAIT);
    if (got <= 0) {
      drop(id, Why::kGone);  // peeked bytes are there to read: anything else is a broken socket
      return;
    }
    bytes += static_cast<std::size_t>(got);
    std::string_view chunk(buffer, static_cast<std::size_t>(got));
    if (client.discarding) {
      const std::size_t newline = chunk.find('\n');
      if (newline == std::string_view::npos) {
        continue;
      }
      client.discarding = false;
      ++lines;  // the end of the line too long: not a line, but counted like one
      chunk.remove_prefix(newline + 1);
    }
    client.in.append(chunk);
    if (!handle_lines(client, lines)) {
      return;  // the handler dropped it
    }
  }
  update_timer(client);
}

// Hands every complete line to the handler (serve() took no more than the budget allows); a
// partial line that has outgrown kMaxLineSize is reported as too large and skipped to its end.
// False when the client was dropped meanwhile.
bool ControlServer::handle_lines(Client& client, std::size_t& lines) {
  const ClientId id = client.id;
  for (;;) {
    const std::size_t newline = client.in.find('\n');
    if (newline == std::string::npos) {
      break;
    }
    const std::string line = client.in.substr(0, newline);
    client.in.erase(0, newline + 1);
    ++lines;
    if (client.closing) {
      continue;
    }
    handler_.on_line(id, client.peer, line, false);
    if (!clients_.contains(id)) {
      return false;
    }
  }
  if (client.in.size() > kMaxLineSize) {
    client.in.clear();
    client.discarding = true;
    if (!client.closing) {
      handler_.on_line(id, client.peer, {}, true);
      if (!clients_.contains(id)) {
        return false;
      }
    }
  }
  return true;
}

// A partial line runs the partial-line clock from its first byte (more bytes do not restart it);
// a client owed nothing, with nothing to send and no partial line, runs the idle clock from its
// last activity; a client the handler holds, or one being written to, runs none.
void ControlServer::update_timer(Client& client) {
  Client::Clock clock = Client::Clock::kNone;
  if (!client.in.empty() || client.discarding) {
    clock = Client::Clock::kPartialLine;
  } else if (client.holds == 0 && client.out.empty() && !client.closing) {
    clock = Client::Clock::kIdle;
  }
  if (clock == client.clock && clock != Client::Clock::kIdle) {
    return;
  }
  client.clock = clock;
  if (clock == Client::Clock::kNone) {
    (void)sd_event_source_set_enabled(client.timer, SD_EVENT_OFF);
    return;
  }
  const std::uint64_t at =
      usec_after(event_, clock == Client::Clock::kIdle ? timeouts_.idle : timeouts_.partial_line);
  if (client.timer == nullptr) {
    (void)sd_event_add_time(event_, &client.timer, CLOCK_MONOTONIC, at, 0,
                            &ControlServer::on_timeout, &client);
    return;
  }
  (void)sd_event_source_set_time(client.timer, at);
  (void)sd_event_source_set_enabled(client.timer, SD_EVENT_ONESHOT);
}

void ControlServer::hold(ClientId id) {
  const auto found = clients_.find(id);
  if (found != clients_.end()) {
    ++found->second->holds;
    update_timer(*found->second);
  }
}

void ControlServer::release_hold(ClientId id) {
  const auto found = clients_.find(id);
  if (found != clients_.end() && found->second->holds > 0) {
    --found->second->holds;
    update_timer(*found->second);
  }
}

void ControlServer::send(ClientId id, const std::string& line) {
  const auto found = clients_.find(id);
  if (found == clients_.end()) {
    return;
  }
  Client& client = *found->second;
  if (client.out.size() + line.size() > kMaxQueued) {
    drop(id, Why::kUnread);  // it stopped reading; it must not make the daemon hold its replies
    return;
  }
  client.out += line;
  write_to(client);
}

void ControlServer::close_after_send(ClientId id) {
  const auto found = clients_.find(id);
  if (found == clients_.end()) {
    return;
  }
  found->second->closing = true;
  if (found->second->out.empty()) {
    drop(id, Why::kGone);
  }
}

void ControlServer::write_to(Client& client) {
  while (!client.out.empty()) {
    const ssize_t sent =
        ::send(client.fd.get(), client.out.data(), client.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EAGAIN || errno == EINTR) {
        break;
      }
      drop(client.id, Why::kGone);
      return;
    }
    client.out.erase(0, static_cast<std::size_t>(sent));
  }
  if (client.out.empty() && client.closing) {
    drop(client.id, Why::kGone);
    return;
  }
  update_events(client);
  update_timer(client);
}

void ControlServer::update_events(Client& client) {
  (void)sd_event_source_set_io_events(client.io,
                                      client.out.empty() ? EPOLLIN : (EPOLLIN | EPOLLOUT));
}

void ControlServer::drop(ClientId id, Why why) {
  const auto found = clients_.find(id);
  if (found == clients_.end()) {
    return;
  }
  const std::unique_ptr<Client> client = std::move(found->second);
  clients_.erase(found);
  switch (why) {
    case Why::kGone: break;
    case Why::kPartialLine:
      ++counters_.dropped_partial_line;
      log(Priority::kDebug, "dropped a control client (" + who(client->peer) +
                                "): a partial line was left unfinished for " +
                                std::to_string(timeouts_.partial_line.count()) + " ms");
      break;
    case Why::kIdle:
      ++counters_.dropped_idle;
      log(Priority::kDebug, "dropped a control client (" + who(client->peer) + "): silent for " +
                                std::to_string(timeouts_.idle.count()) +
                                " ms with nothing to answer");
      break;
    case Why::kUnread:
      ++counters_.dropped_unread;
      if (const auto count = unread_log_.due(event_)) {
        log(Priority::kWarning,
            "dropped " + std::to_string(count) +
                " control client(s) since the last such message, the latest (" + who(client->peer) +
                "): more than " + std::to_string(kMaxQueued) +
                " bytes of replies and events unread; a client of 'watch' must read its stream");
      }
      break;
  }
  handler_.on_disconnect(id);
}

}  // namespace blkfence::daemon

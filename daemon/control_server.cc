// The control socket's transport (daemon layer). See control_server.h.
#include "control_server.h"

#include <cerrno>
#include <cstring>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-event.h>
#include <unistd.h>

namespace blkfence::daemon {

struct ControlServer::Client {
  ControlServer* server = nullptr;
  ClientId id = 0;
  UniqueFd fd;
  Peer peer;
  sd_event_source* io = nullptr;
  sd_event_source* idle = nullptr;
  std::string in;
  std::string out;
  bool discarding = false;  // inside a line that was too long: skip to its end
  bool closing = false;

  ~Client() {
    sd_event_source_disable_unref(io);
    sd_event_source_disable_unref(idle);
  }
};

ControlServer::ControlServer(sd_event* event, ControlHandler& handler,
                             std::chrono::milliseconds idle_timeout)
    : event_(event), handler_(handler), idle_timeout_(idle_timeout) {}

Result<std::unique_ptr<ControlServer>> ControlServer::make(sd_event* event, const std::string& path,
                                                           ControlHandler& handler,
                                                           std::chrono::milliseconds idle_timeout) {
  std::unique_ptr<ControlServer> server(new ControlServer(event, handler, idle_timeout));
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
  const int r = sd_event_add_io(event, &server->listen_source_, server->listen_fd_.get(), EPOLLIN,
                                &ControlServer::on_accept, server.get());
  if (r < 0) {
    return tl::unexpected(Error::os(-r, "sd_event_add_io"));
  }
  return server;
}

ControlServer::~ControlServer() {
  clients_.clear();
  sd_event_source_disable_unref(listen_source_);
  if (!path_.empty()) {
    (void)::unlink(path_.c_str());
  }
}

int ControlServer::on_accept(sd_event_source*, int, std::uint32_t, void* self) {
  static_cast<ControlServer*>(self)->accept_one();
  return 0;
}

void ControlServer::accept_one() {
  for (;;) {
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      return;  // EAGAIN, or a client that vanished before we got to it
    }
    if (clients_.size() >= kMaxClients) {
      static constexpr char kBusy[] =
          R"({"v":1,"id":null,"ok":false,"error":{"code":"busy","message":"too many clients"}})"
          "\n";
      (void)::send(fd.get(), kBusy, sizeof kBusy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      continue;
    }
    auto client = std::make_unique<Client>();
    client->server = this;
    client->id = next_id_++;
    ucred credentials{};
    socklen_t size = sizeof credentials;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &credentials, &size) != 0) {
      continue;
    }
    client->peer =
        Peer{.pid = credentials.pid, .uid = credentials.uid, .gid = credentials.gid, .groups = {}};
    std::vector<gid_t> groups(64);
    socklen_t groups_size = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERGROUPS, groups.data(), &groups_size) == 0) {
      groups.resize(groups_size / sizeof(gid_t));
      client->peer.groups = std::move(groups);
    }
    client->fd = std::move(fd);
    if (sd_event_add_io(event_, &client->io, client->fd.get(), EPOLLIN,
                        &ControlServer::on_client_io, client.get()) < 0) {
      continue;
    }
    clients_.emplace(client->id, std::move(client));
  }
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
    server->read_from(*client);
  }
  return 0;
}

int ControlServer::on_idle(sd_event_source*, std::uint64_t, void* pointer) {
  auto* client = static_cast<Client*>(pointer);
  client->server->drop(client->id);  // a partial line left hanging: a slow or stuck client
  return 0;
}

void ControlServer::read_from(Client& client) {
  const ClientId id = client.id;
  char buffer[16 * 1024];
  for (;;) {
    const ssize_t got = ::recv(client.fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
      drop(id);
      return;
    }
    if (got < 0) {
      break;
    }
    client.in.append(buffer, static_cast<std::size_t>(got));
    std::size_t start = 0;
    for (;;) {
      const std::size_t newline = client.in.find('\n', start);
      if (newline == std::string::npos) {
        break;
      }
      const std::string_view line(client.in.data() + start, newline - start);
      start = newline + 1;
      if (client.discarding) {
        client.discarding = false;
        continue;
      }
      if (client.closing) {
        continue;
      }
      handler_.on_line(id, client.peer, line, false);
      if (!clients_.contains(id)) {
        return;
      }
    }
    client.in.erase(0, start);
    if (client.in.size() > kMaxLineSize) {
      if (!client.discarding) {
        handler_.on_line(id, client.peer, {}, true);
        if (!clients_.contains(id)) {
          return;
        }
      }
      client.discarding = true;
      client.in.clear();
    }
  }
  // A partial line starts the idle clock; a complete one stops it.
  if (client.in.empty() && !client.discarding) {
    sd_event_source_disable_unref(client.idle);
    client.idle = nullptr;
  } else if (client.idle == nullptr) {
    std::uint64_t now = 0;
    (void)sd_event_now(event_, CLOCK_MONOTONIC, &now);
    const auto timeout = std::chrono::microseconds(idle_timeout_).count();
    (void)sd_event_add_time(event_, &client.idle, CLOCK_MONOTONIC,
                            now + static_cast<std::uint64_t>(timeout), 0, &ControlServer::on_idle,
                            &client);
  }
}

void ControlServer::send(ClientId id, const std::string& line) {
  const auto found = clients_.find(id);
  if (found == clients_.end()) {
    return;
  }
  Client& client = *found->second;
  if (client.out.size() + line.size() > kMaxQueued) {
    drop(id);  // it stopped reading; it must not make the daemon hold its replies forever
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
    drop(id);
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
      drop(client.id);
      return;
    }
    client.out.erase(0, static_cast<std::size_t>(sent));
  }
  if (client.out.empty() && client.closing) {
    drop(client.id);
    return;
  }
  update_events(client);
}

void ControlServer::update_events(Client& client) {
  (void)sd_event_source_set_io_events(client.io,
                                      client.out.empty() ? EPOLLIN : (EPOLLIN | EPOLLOUT));
}

void ControlServer::drop(ClientId id) {
  const auto found = clients_.find(id);
  if (found == clients_.end()) {
    return;
  }
  const std::unique_ptr<Client> client = std::move(found->second);
  clients_.erase(found);
  handler_.on_disconnect(id);
}

}  // namespace blkfence::daemon

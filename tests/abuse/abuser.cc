// blkfence_abuser: what one local user can do to blkfenced's control socket, run by the abuse
// harness (abuse_test.cc) as an unprivileged user until it is killed. Raw sockets and hand-written
// request lines only: no protocol library, as an attacker would. Threads, each looping:
//   idle     holds connections that never send a byte (reconnects when one is closed);
//   keys     pipelines `keys` requests on a connection and reads the answers, as fast as it can;
//   watch    a `watch` that never reads, with the smallest receive buffer, made to pile up output
//            by pipelined `metrics` requests (reconnects when dropped);
//   partial  sends a request one byte at a time, 200 ms apart, never ending the line.
// Prints "ready" once the idle connections are open (refused ones count: the daemon decides), and
// on SIGTERM a line of counts. Usage: blkfence_abuser SOCKET RESOURCE IDLE KEYS WATCH PARTIAL
// (connections of each kind).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace {

std::atomic<bool> g_stop{false};
std::atomic<unsigned long> g_keys_answers{0};
std::atomic<unsigned long> g_reconnects{0};
std::atomic<unsigned long> g_refused{0};
std::string g_path;
std::string g_resource;

int connect_socket() {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, g_path.c_str(), sizeof address.sun_path - 1);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
    return fd;
  }
  if (fd >= 0) {
    ::close(fd);
  }
  return -1;
}

bool send_all(int fd, const std::string& bytes) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      return false;
    }
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

// Whether the daemon closed fd (POLLHUP is reported without reading what it queued).
bool closed(int fd) {
  pollfd entry{.fd = fd, .events = POLLRDHUP, .revents = 0};
  return ::poll(&entry, 1, 0) == 1 && (entry.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

void pause_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void idle(std::vector<int> fds) {
  while (!g_stop) {
    for (int& fd : fds) {
      if (fd < 0 || closed(fd)) {
        if (fd >= 0) {
          ::close(fd);
          ++g_refused;  // refused (busy) or dropped (idle): either way, try again
        }
        fd = connect_socket();
        ++g_reconnects;
      }
    }
    pause_ms(100);  // an attacker's pace; the daemon's limits do not depend on it
  }
}

void keys() {
  std::string burst;
  for (int i = 0; i < 64; ++i) {
    burst += R"({"v":1,"id":)" + std::to_string(i) + R"(,"op":"keys","resource":")" + g_resource +
             "\"}\n";
  }
  while (!g_stop) {
    const int fd = connect_socket();
    if (fd < 0 || !send_all(fd, burst)) {
      if (fd >= 0) {
        ::close(fd);
      }
      pause_ms(50);
      continue;
    }
    // Read the 64 answers (or whatever comes before the connection ends), then again.
    int lines = 0;
    char buffer[65536];
    while (!g_stop && lines < 64) {
      pollfd entry{.fd = fd, .events = POLLIN, .revents = 0};
      if (::poll(&entry, 1, 1000) <= 0) {
        break;
      }
      const ssize_t got = ::recv(fd, buffer, sizeof buffer, 0);
      if (got <= 0) {
        break;
      }
      for (ssize_t i = 0; i < got; ++i) {
        lines += buffer[i] == '\n' ? 1 : 0;
      }
    }
    g_keys_answers += static_cast<unsigned long>(lines);
    ::close(fd);
  }
}

void watch() {
  const std::string request = R"({"v":1,"id":1,"op":"watch","resource":")" + g_resource + "\"}\n";
  std::string metrics;
  for (int i = 0; i < 256; ++i) {
    metrics += R"({"v":1,"id":)" + std::to_string(i + 2) +
               R"(,"op":"metrics"})"
               "\n";
  }
  while (!g_stop) {
    const int fd = connect_socket();
    if (fd < 0) {
      pause_ms(50);
      continue;
    }
    const int small = 1;
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    (void)send_all(fd, request);
    while (!g_stop && !closed(fd) && send_all(fd, metrics)) {
      pause_ms(20);
    }
    ::close(fd);
    ++g_reconnects;
  }
}

void partial() {
  const std::string request = R"({"v":1,"id":1,"op":"status")";
  while (!g_stop) {
    const int fd = connect_socket();
    if (fd < 0) {
      pause_ms(50);
      continue;
    }
    for (std::size_t i = 0; !g_stop && !closed(fd); i = (i + 1) % request.size()) {
      if (!send_all(fd, request.substr(i, 1))) {
        break;
      }
      pause_ms(200);
    }
    ::close(fd);
    ++g_reconnects;
  }
}

void on_term(int) {
  g_stop = true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s SOCKET RESOURCE IDLE KEYS WATCH PARTIAL\n", argv[0]);
    return 2;
  }
  g_path = argv[1];
  g_resource = argv[2];
  const int idle_count = std::atoi(argv[3]);
  const int keys_count = std::atoi(argv[4]);
  const int watch_count = std::atoi(argv[5]);
  const int partial_count = std::atoi(argv[6]);
  struct sigaction action {};
  action.sa_handler = on_term;
  (void)::sigaction(SIGTERM, &action, nullptr);

  std::vector<int> idle_fds(static_cast<std::size_t>(std::max(idle_count, 0)), -1);
  for (int& fd : idle_fds) {
    fd = connect_socket();
  }
  std::vector<std::thread> threads;
  threads.emplace_back(idle, std::move(idle_fds));
  for (int i = 0; i < keys_count; ++i) {
    threads.emplace_back(keys);
  }
  for (int i = 0; i < watch_count; ++i) {
    threads.emplace_back(watch);
  }
  for (int i = 0; i < partial_count; ++i) {
    threads.emplace_back(partial);
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (auto& thread : threads) {
    thread.join();
  }
  std::printf("keys answers %lu, reconnects %lu, refused or dropped %lu\n", g_keys_answers.load(),
              g_reconnects.load(), g_refused.load());
  return 0;
}

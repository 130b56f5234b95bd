#include "keel/monitor/http_guard.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace keel::monitor {
namespace {

// httplib::Server's connection handler is private. An explicit instantiation may name a private
// member ([temp.explicit]/12), which is how the guard reaches it without patching the library;
// called on a GuardedServer (which does not override it) it runs httplib's own code.
using ConnectionHandler = bool (httplib::Server::*)(socket_t);
ConnectionHandler serve_connection = nullptr;
template <ConnectionHandler H>
struct ExposeConnectionHandler {
  static inline const bool set = (serve_connection = H, true);
};
template struct ExposeConnectionHandler<&httplib::Server::process_and_close_socket>;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST] = {};
  ::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0,
                NI_NUMERICHOST);
  return host;
}

}  // namespace

GuardedServer::GuardedServer(Limits limits) : limits_(limits) {
  // What a browser's poll needs; a client that sends nothing for 5 s is let go.
  set_read_timeout(5);
  set_keep_alive_timeout(5);
  set_payload_max_length(64 << 10);
  reaper_ = std::thread([this] { Reap(); });
}

GuardedServer::~GuardedServer() {
  Stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

int GuardedServer::Listen(const std::string& addr, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (::getaddrinfo(addr == "localhost" ? "127.0.0.1" : addr.c_str(), std::to_string(port).c_str(),
                    &hints, &res) != 0)
    return -1;
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok =
      fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
  ::freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  listen_fd_ = fd;
  svr_sock_ = fd;  // httplib keeps a connection alive only while this is set
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

void GuardedServer::Run() {
  for (;;) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (svr_sock_ == INVALID_SOCKET) return;
      continue;
    }
    const int sock = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (sock < 0) {
      // Out of descriptors: the pending connection stays readable; wait rather than spin.
      if (errno == EMFILE || errno == ENFILE) ::usleep(100000);
      continue;
    }
    const std::string peer = PeerAddress(sock);
    int id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (svr_sock_ == INVALID_SOCKET || open_ >= limits_.total ||
          per_client_[peer] >= limits_.per_client) {
        ::close(sock);
        continue;
      }
      ++open_;
      ++per_client_[peer];
      id = next_id_++;
      conns_[id] = Open{::dup(sock), Now(), false};
    }
    std::thread([this, sock, peer, id] {
      (this->*serve_connection)(sock);  // closes sock
      std::lock_guard<std::mutex> lock(mu_);
      ::close(conns_[id].fd);
      conns_.erase(id);
      if (--per_client_[peer] == 0) per_client_.erase(peer);
      --open_;
      cv_.notify_all();
    }).detach();
  }
}

bool GuardedServer::ServeConnection(int sock) { return (this->*serve_connection)(sock); }

void GuardedServer::Reap() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(250));
    const double now = Now();
    for (auto& [id, c] : conns_)
      if (!c.shut && now - c.started > limits_.deadline_s) {
        ::shutdown(c.fd, SHUT_RDWR);  // the serving thread's reads and writes fail; it closes
        c.shut = true;
      }
  }
}

void GuardedServer::Stop() {
  std::unique_lock<std::mutex> lock(mu_);
  svr_sock_ = INVALID_SOCKET;
  for (auto& [id, c] : conns_) ::shutdown(c.fd, SHUT_RDWR);
  cv_.wait(lock, [&] { return open_ == 0; });
}

}  // namespace keel::monitor

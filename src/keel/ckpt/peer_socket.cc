#include "keel/ckpt/peer_socket.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "keel/core/error.h"

namespace keel::ckpt::peer {
namespace {

[[noreturn]] void Fail(const std::string& peer, const std::string& what) {
  throw Error(ExitCode::kRuntime, "tier-0 holder " + peer + ": " + what);
}

addrinfo* Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0)
    Fail(host + ":" + std::to_string(port), std::string("cannot resolve: ") + gai_strerror(rc));
  return res;
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    peer_ = std::move(o.peer_);
    o.fd_ = -1;
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

void Socket::SetTimeout(double seconds) {
  timeval tv{};
  tv.tv_sec = time_t(seconds);
  tv.tv_usec = suseconds_t((seconds - std::floor(seconds)) * 1e6);
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

Socket Socket::Connect(const std::string& host, int port, double timeout_s) {
  const std::string name = host + ":" + std::to_string(port);
  addrinfo* res = Resolve(host, port, false);
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    Fail(name, std::string("socket: ") + std::strerror(errno));
  }
  Socket s(fd, name);
  s.SetTimeout(timeout_s);  // Linux applies SO_SNDTIMEO to connect() too
  const int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  const int err = errno;
  freeaddrinfo(res);
  if (rc != 0) Fail(name, std::string("cannot connect: ") + std::strerror(err));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return s;
}

void Socket::SendAll(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd_, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      Fail(peer_, std::string("send failed: ") + (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)
                                                      ? "timed out"
                                                      : std::strerror(errno)));
    c += w;
    n -= size_t(w);
  }
}

void Socket::RecvAll(void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd_, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) Fail(peer_, "connection closed early");
    if (r < 0)
      Fail(peer_,
           std::string("receive failed: ") +
               (errno == EAGAIN || errno == EWOULDBLOCK ? "timed out" : std::strerror(errno)));
    c += r;
    n -= size_t(r);
  }
}

std::string Socket::RecvLine() {
  std::string line;
  for (char ch;;) {
    RecvAll(&ch, 1);
    if (ch == '\n') return line;
    line.push_back(ch);
    if (line.size() > 4096) Fail(peer_, "a line longer than 4 KiB (not keel's protocol)");
  }
}

int Listen(const std::string& bind_addr, int port) {
  const std::string name = bind_addr + ":" + std::to_string(port);
  addrinfo* res = Resolve(bind_addr, port, true);
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const bool ok =
      fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
  const int err = errno;
  freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    throw Error(ExitCode::kRuntime,
                "keel holder: cannot listen on " + name + ": " + std::strerror(err));
  }
  return fd;
}

}  // namespace keel::ckpt::peer

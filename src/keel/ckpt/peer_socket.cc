#include "keel/ckpt/peer_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
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

// The local door of the holder listening on TCP ip:port: "\0keel-holder-IP-PORT" (abstract: no
// file to leave behind, or to collide in a /tmp that namespace hosts share).
socklen_t LocalAddress(const std::string& ip, int port, sockaddr_un* a) {
  *a = {};
  a->sun_family = AF_UNIX;
  const std::string name = "keel-holder-" + ip + "-" + std::to_string(port);
  std::memcpy(a->sun_path + 1, name.data(), name.size());
  return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    if (received_fd_ >= 0) ::close(received_fd_);
    fd_ = o.fd_;
    received_fd_ = o.received_fd_;
    peer_ = std::move(o.peer_);
    o.fd_ = o.received_fd_ = -1;
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
  if (received_fd_ >= 0) ::close(received_fd_);
}

int Socket::TakeFd() {
  const int fd = received_fd_;
  received_fd_ = -1;
  return fd;
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

Socket Socket::ConnectLocal(const std::string& host, int port, double timeout_s) {
  const std::string name = host + ":" + std::to_string(port) + " (local)";
  addrinfo* res = Resolve(host, port, false);
  char ip[INET_ADDRSTRLEN] = "";
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, ip, sizeof ip);
  freeaddrinfo(res);
  // As TCP would route it: to a holder bound to that address, else to one bound to all.
  int err = 0;
  for (const std::string& bound : {std::string(ip), std::string("0.0.0.0")}) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) Fail(name, std::string("socket: ") + std::strerror(errno));
    Socket s(fd, name);
    s.SetTimeout(timeout_s);
    sockaddr_un a;
    const socklen_t len = LocalAddress(bound, port, &a);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), len) == 0) return s;
    err = errno;
  }
  Fail(name, std::string("cannot connect: ") + std::strerror(err));
}

void Socket::SendLineWithFd(const std::string& line, int fd) {
  const std::string text = line + "\n";
  iovec io{const_cast<char*>(text.data()), text.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = control;
  m.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  ssize_t w;
  do {
    w = ::sendmsg(fd_, &m, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  if (w < 0) Fail(peer_, std::string("send failed: ") + std::strerror(errno));
  // The descriptor went with the first byte; the rest of a long line goes plainly.
  if (size_t(w) < text.size()) SendAll(text.data() + w, text.size() - size_t(w));
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
    // recvmsg, not recv: on a local socket a descriptor may come with the bytes, and recv would
    // drop it (on TCP there is never one).
    iovec io{c, n};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr m{};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    const ssize_t r = ::recvmsg(fd_, &m, MSG_CMSG_CLOEXEC);
    for (cmsghdr* h = r > 0 ? CMSG_FIRSTHDR(&m) : nullptr; h; h = CMSG_NXTHDR(&m, h)) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      int got;
      std::memcpy(&got, CMSG_DATA(h), sizeof got);
      if (received_fd_ >= 0) ::close(received_fd_);
      received_fd_ = got;
    }
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

int ListenLocal(const sockaddr_in& bound) {
  char ip[INET_ADDRSTRLEN] = "";
  ::inet_ntop(AF_INET, &bound.sin_addr, ip, sizeof ip);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un a;
  const socklen_t len = LocalAddress(ip, ntohs(bound.sin_port), &a);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), len) != 0 || ::listen(fd, 64) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool IsLocalAddress(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool local = false;
  // Binding succeeds only to an address of one of this namespace's interfaces.
  for (addrinfo* r = res; r && !local; r = r->ai_next) {
    const int fd = ::socket(r->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    local = ::bind(fd, r->ai_addr, r->ai_addrlen) == 0;
    ::close(fd);
  }
  freeaddrinfo(res);
  return local;
}

}  // namespace keel::ckpt::peer

// Blocking TCP with timeouts, for tier-0 checkpoints (peer_client.h, peer_holder.h), and a Unix
// socket that carries a descriptor to a holder of the same host: a line of
// text then raw bytes, both ways (a PUT's xxh3 follows its bytes, so the sender hashes as it
// sends). Every call throws keel::Error (runtime) naming the peer and what
// failed. The timeout bounds each wait for the peer (connect, and every send or receive that makes
// no progress), not a whole transfer: a holder on a host that vanished costs one timeout, a slow
// one as long as it keeps moving bytes.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::ckpt::peer {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  Socket(Socket&& o) noexcept
      : fd_(o.fd_), received_fd_(o.received_fd_), peer_(std::move(o.peer_)) {
    o.fd_ = o.received_fd_ = -1;
  }
  Socket& operator=(Socket&& o) noexcept;
  ~Socket();

  // Connects to host:port within `timeout_s`, which then bounds every wait on the socket.
  static Socket Connect(const std::string& host, int port, double timeout_s);
  // The holder of host:port (an address of this host) through its local door (ListenLocal);
  // throws when it has none.
  static Socket ConnectLocal(const std::string& host, int port, double timeout_s);
  void SendAll(const void* p, size_t n);
  void SendLine(const std::string& line) { SendAll((line + "\n").data(), line.size() + 1); }
  // On a local socket: the line with a descriptor for the peer to use (SCM_RIGHTS).
  void SendLineWithFd(const std::string& line, int fd);
  void RecvAll(void* p, size_t n);
  // Up to '\n' (not included); lines longer than 4 KiB are refused.
  std::string RecvLine();
  // On a local socket: the descriptor that came with what was received, now the caller's, or -1.
  int TakeFd();
  void SetTimeout(double seconds);
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }

 private:
  int fd_ = -1;
  int received_fd_ = -1;
  std::string peer_;
};

// Listens on bind_addr:port (a name or an address); throws naming them when it cannot.
int Listen(const std::string& bind_addr, int port);

// The holder's second door, for ranks on its own host: an abstract Unix socket named after the
// address and port its TCP socket is bound to. Abstract names belong to the network namespace, as
// addresses do, so a rank that reaches it reaches the holder it would over TCP. -1 when the name
// is taken (the TCP door still serves).
int ListenLocal(const sockaddr_in& bound);

// Whether `host` names an address of this host (of its network namespace).
bool IsLocalAddress(const std::string& host);

}  // namespace keel::ckpt::peer

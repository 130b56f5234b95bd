// Blocking TCP with timeouts, for tier-0 checkpoints (peer_client.h, peer_holder.h): a line of
// text then raw bytes, both ways (a PUT's xxh3 follows its bytes, so the sender hashes as it
// sends). Every call throws keel::Error (runtime) naming the peer and what
// failed. The timeout bounds each wait for the peer (connect, and every send or receive that makes
// no progress), not a whole transfer: a holder on a host that vanished costs one timeout, a slow
// one as long as it keeps moving bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::ckpt::peer {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_), peer_(std::move(o.peer_)) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  ~Socket();

  // Connects to host:port within `timeout_s`, which then bounds every wait on the socket.
  static Socket Connect(const std::string& host, int port, double timeout_s);
  void SendAll(const void* p, size_t n);
  void SendLine(const std::string& line) { SendAll((line + "\n").data(), line.size() + 1); }
  void RecvAll(void* p, size_t n);
  // Up to '\n' (not included); lines longer than 4 KiB are refused.
  std::string RecvLine();
  void SetTimeout(double seconds);
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }

 private:
  int fd_ = -1;
  std::string peer_;
};

// Listens on bind_addr:port (a name or an address); throws naming them when it cannot.
int Listen(const std::string& bind_addr, int port);

}  // namespace keel::ckpt::peer

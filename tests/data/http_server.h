// A real HTTP server for the remote-dataset tests: python3 -m http.server serving a folder on
// 127.0.0.1 at a free port, killed at scope exit (or by Stop(), to play a server that dies;
// Pause(), one that hangs).
//
//   HttpServer server(dir);
//   std::string url = server.url("ds");   // http://127.0.0.1:PORT/ds
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

namespace keel::data {

// A free loopback port: bind to port 0 and let the kernel choose.
inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline bool Answers(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

class HttpServer {
 public:
  explicit HttpServer(const std::string& dir) : port_(FreePort()) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int null = ::open("/dev/null", O_WRONLY);  // it logs every request to stderr
      ::dup2(null, 1);
      ::dup2(null, 2);
      const std::string port = std::to_string(port_);
      ::execl("/usr/bin/python3", "python3", "-m", "http.server", port.c_str(), "--bind",
              "127.0.0.1", "--directory", dir.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !Answers(port_); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  ~HttpServer() { Stop(); }
  void Stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  // A server that hangs: connections are still accepted by the kernel, nothing is answered.
  void Pause() { ::kill(pid_, SIGSTOP); }
  void Resume() { ::kill(pid_, SIGCONT); }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + path;
  }
  bool up() const { return Answers(port_); }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace keel::data

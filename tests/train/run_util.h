// Running the `keel` executable from tests: its exit code, stdout and stderr.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace keel::test {

struct RunResult {
  int code = -1;
  std::string out, err;
};

// The "loss" of every line of a run's metrics.jsonl, in order.
inline std::vector<double> Losses(const std::string& metrics_path) {
  std::vector<double> losses;
  std::ifstream f(metrics_path);
  for (std::string line; std::getline(f, line);)
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return losses;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `cmd` through the shell with OMP_NUM_THREADS=2 unless the command sets it.
inline RunResult RunCommand(const std::string& cmd) {
  static int n = 0;
  const std::string base = std::filesystem::temp_directory_path() /
                           ("keel_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
  const std::string full = cmd + " >" + base + ".out 2>" + base + ".err";
  int status = std::system(full.c_str());
  RunResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(base + ".out");
  r.err = ReadFile(base + ".err");
  std::filesystem::remove(base + ".out");
  std::filesystem::remove(base + ".err");
  return r;
}

// A fresh, empty temporary directory, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    static int n = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("keel_dir_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A loopback TCP port this process listens on (so that another cannot), until Free() or the end.
class TakenPort {
 public:
  TakenPort() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd_, 1) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port_ = std::to_string(ntohs(a.sin_port));
  }
  ~TakenPort() { Free(); }
  TakenPort(const TakenPort&) = delete;
  TakenPort& operator=(const TakenPort&) = delete;
  const std::string& port() const { return port_; }  // empty if none could be taken
  void Free() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  std::string port_;
};

}  // namespace keel::test

// Running the `keel` executable from tests: its exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

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

}  // namespace keel::test

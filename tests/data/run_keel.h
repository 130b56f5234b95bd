// Runs the real `keel` executable for command-line tests: exit code and stdout + stderr together.
//
//   KeelResult r = Keel("data verify " + dir);
//   EXPECT_EQ(r.code, 2) << r.output;
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace keel::data {

struct KeelResult {
  int code;  // exit status; -1 if it did not exit normally
  std::string output;
};

inline KeelResult Keel(const std::string& args) {
  std::string cmd = std::string(KEEL_BINARY) + " " + args + " 2>&1";
  KeelResult r{-1, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace keel::data

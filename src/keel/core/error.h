// Errors: one type that carries its context, caught once at the command line and printed as one
// line with an exit code. KEEL_CHECK is for invariants whose failure means a bug in keel.
//
//   if (n_embd % n_head != 0)
//     throw keel::Error(keel::ExitCode::kBadInput, "[model] n_embd: expected a multiple of
//     n_head");
#pragma once

#include <stdexcept>
#include <string>

namespace keel {

// Exit codes of the `keel` command (DESIGN.md).
enum class ExitCode : int {
  kOk = 0,
  kRuntime = 1,
  kBadInput = 2,
  kTempFail = 75,  // worth restarting: a hang or a lost peer
};

class Error : public std::runtime_error {
 public:
  // `quiet`: another rank of the job prints this error; this one only exits with its code.
  Error(ExitCode code, const std::string& what, bool quiet = false)
      : std::runtime_error(what), code_(code), quiet_(quiet) {}
  ExitCode code() const { return code_; }
  bool quiet() const { return quiet_; }

 private:
  ExitCode code_;
  bool quiet_;
};

// Bad input from the user: a config key, a file, an argument.
[[noreturn]] inline void ThrowBadInput(const std::string& what) {
  throw Error(ExitCode::kBadInput, what);
}
[[noreturn]] inline void ThrowRuntime(const std::string& what) {
  throw Error(ExitCode::kRuntime, what);
}

[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);

}  // namespace keel

#define KEEL_CHECK(cond, msg)                                           \
  do {                                                                  \
    if (!(cond)) ::keel::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

#include "keel/core/error.h"

namespace keel {

void CheckFailed(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(ExitCode::kRuntime, std::string("internal check failed at ") + file + ":" +
                                      std::to_string(line) + ": " + cond + ": " + msg +
                                      " (this is a bug in keel; please report it)");
}

}  // namespace keel

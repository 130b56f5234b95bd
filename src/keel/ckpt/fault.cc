#include "keel/ckpt/fault.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

namespace keel::ckpt {

void MaybeCrash(const char* phase) {
  static const std::string spec = [] {
    const char* e = std::getenv("KEEL_CKPT_CRASH_AT");
    return std::string(e ? e : "");
  }();
  if (spec.empty()) return;
  static int hits = 0;  // only the writer thread reaches the phases
  const size_t colon = spec.find(':');
  if (spec.compare(0, colon, phase) != 0) return;
  const int nth = colon == std::string::npos ? 1 : std::atoi(spec.c_str() + colon + 1);
  if (++hits == nth) std::raise(SIGKILL);
}

}  // namespace keel::ckpt

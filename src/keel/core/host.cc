#include "keel/core/host.h"

#include <unistd.h>

namespace keel {

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace keel

#include "keel/core/log.h"

#include <cstdarg>
#include <cstdio>

namespace keel {
namespace {
int g_rank = -1;
}

void SetLogRank(int rank) { g_rank = rank; }

void Log(const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (g_rank >= 0)
    std::fprintf(stderr, "[rank %d] %s\n", g_rank, buf);
  else
    std::fprintf(stderr, "%s\n", buf);
}

}  // namespace keel

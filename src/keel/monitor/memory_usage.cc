#include "keel/monitor/memory_usage.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>

namespace keel::monitor {

Rss ReadRss() {
  Rss r;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    long size = 0, resident = 0;
    if (std::fscanf(f, "%ld %ld", &size, &resident) == 2)
      r.current = double(resident) * double(sysconf(_SC_PAGESIZE));
    std::fclose(f);
  }
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0) r.peak = double(u.ru_maxrss) * 1024.0;  // KiB on Linux
  if (r.peak < r.current) r.peak = r.current;
  return r;
}

}  // namespace keel::monitor

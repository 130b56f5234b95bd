// This process's resident memory, now and at its peak (what the kernel charges it: the figure an
// out-of-memory kill is decided on).
#pragma once

namespace keel::monitor {

struct Rss {
  double current = 0;  // bytes resident now (/proc/self/statm)
  double peak = 0;     // the high-water mark (getrusage's ru_maxrss)
};

Rss ReadRss();  // zeros where the figures cannot be read

}  // namespace keel::monitor

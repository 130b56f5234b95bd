// The memory measurements behind machine_probe.h (the arithmetic loops: core/cpu_rates.cc).
#include "keel/monitor/machine_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace keel::monitor {

double MeasureCopyRate(int threads, size_t bytes, int reps) {
  threads = std::max(1, threads);
  const size_t share = bytes / size_t(threads) / 64 * 64;
  if (share == 0) return 0;
  std::vector<char> src(share * threads), dst(share * threads);
  // Touch every page first, so the timed copies measure memory, not page faults.
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 2, dst.size());
  double best = 0;
  for (int rep = 0; rep < std::max(1, reps); ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    pool.reserve(size_t(threads));
    for (int t = 0; t < threads; ++t)
      pool.emplace_back(
          [&, t] { std::memcpy(dst.data() + t * share, src.data() + t * share, share); });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(share * threads) / s);
  }
  if (dst[share * threads - 1] != 1) return 0;  // keeps the copy from being optimized away
  return best;
}

namespace {

double MemInfo(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (in >> key >> kb >> unit)
    if (key == field) return kb * 1024;
  return 0;
}

}  // namespace

double MemTotalBytes() { return MemInfo("MemTotal:"); }

}  // namespace keel::monitor

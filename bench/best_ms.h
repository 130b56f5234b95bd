// The best of `reps` timings of f(), in milliseconds: the kernel benchmarks' measure (the least
// disturbed run on a noisy machine).
#pragma once

#include <algorithm>

#include "keel/core/timer.h"

namespace keel::bench {

template <typename F>
double BestMs(int reps, F f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    Timer t;
    f();
    best = std::min(best, t.Millis());
  }
  return best;
}

}  // namespace keel::bench

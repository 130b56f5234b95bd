// Small statistics over windows of recent values (step times, throughputs, losses).
#pragma once

#include <algorithm>
#include <vector>

namespace keel {

// The middle value of `v` (the upper one of the two middles for an even count), 0 when empty.
// Robust to the odd slow step (a save, a validation) that a mean would follow. Takes a copy: it
// reorders it.
inline double WindowMedian(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace keel

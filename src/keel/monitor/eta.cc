#include "keel/monitor/eta.h"

#include <algorithm>
#include <vector>

#include "keel/core/stats.h"

namespace keel::monitor {

void Eta::Add(double step_ms) {
  ms_.push_back(step_ms);
  if (ms_.size() > window_) ms_.pop_front();
}

double Eta::SecondsLeft(long steps_left) const {
  if (ms_.empty()) return -1;
  return double(std::max(0L, steps_left)) * WindowMedian({ms_.begin(), ms_.end()}) / 1e3;
}

}  // namespace keel::monitor

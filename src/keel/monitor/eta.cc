#include "keel/monitor/eta.h"

#include <algorithm>
#include <vector>

namespace keel::monitor {

void Eta::Add(double step_ms) {
  ms_.push_back(step_ms);
  if (ms_.size() > window_) ms_.pop_front();
}

double Eta::SecondsLeft(long steps_left) const {
  if (ms_.empty()) return -1;
  std::vector<double> v(ms_.begin(), ms_.end());
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return double(std::max(0L, steps_left)) * v[v.size() / 2] / 1e3;
}

}  // namespace keel::monitor

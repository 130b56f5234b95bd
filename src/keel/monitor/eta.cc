#include "keel/monitor/eta.h"

#include <algorithm>
#include <cstdio>
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

std::string FormatDuration(double seconds) {
  if (seconds < 0) return "?";
  const long s = long(seconds + 0.5);
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else if (s < 86400)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  else
    std::snprintf(buf, sizeof buf, "%ldd%02ldh", s / 86400, (s % 86400) / 3600);
  return buf;
}

}  // namespace keel::monitor

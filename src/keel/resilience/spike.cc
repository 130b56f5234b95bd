#include "keel/resilience/spike.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "keel/core/stats.h"

namespace keel::resilience {

std::optional<std::string> SpikeDetector::Check(double x) const {
  if (!std::isfinite(x) || int(values_.size()) < std::max(2, rule_.min_samples))
    return std::nullopt;
  double mean = 0;
  for (double v : values_) mean += v;
  mean /= double(values_.size());
  double var = 0;
  for (double v : values_) var += (v - mean) * (v - mean);
  const double dev = std::sqrt(var / double(values_.size() - 1));
  const double median = WindowMedian({values_.begin(), values_.end()});
  // A window of identical values has no deviation: any rise past the ratio is a spike.
  const double z = dev > 0 ? (x - mean) / dev : (x > mean ? INFINITY : 0.0);
  const double ratio = median > 0 ? x / median : 0.0;
  if (!(z > rule_.z && ratio > rule_.ratio)) return std::nullopt;
  char line[256];
  std::snprintf(line, sizeof line,
                "%s %.4g is %.1f deviations above the mean of the last %zu (%.4g) and %.2fx their "
                "median (thresholds: z %.1f, ratio %.2f)",
                what_.c_str(), x, z, values_.size(), mean, ratio, rule_.z, rule_.ratio);
  return std::string(line);
}

void SpikeDetector::Add(double x) {
  if (!std::isfinite(x)) return;
  values_.push_back(x);
  while (int(values_.size()) > std::max(1, rule_.window)) values_.pop_front();
}

void SpikeDetector::FromJson(const nlohmann::json& j) {
  values_.clear();
  if (j.is_array())
    for (const auto& v : j)
      if (v.is_number()) Add(v.get<double>());
}

}  // namespace keel::resilience

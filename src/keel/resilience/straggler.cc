#include "keel/resilience/straggler.h"

#include <algorithm>

namespace keel::resilience {

std::vector<double> StragglerScores(const std::vector<double>& compute_ms,
                                    const std::vector<int>& group) {
  const size_t n = compute_ms.size();
  std::vector<double> scores(n, 1.0);
  if (n < 2) return scores;
  for (size_t r = 0; r < n; ++r) {
    std::vector<double> others;
    for (size_t o = 0; o < n; ++o)
      if (o != r && (group.empty() || group[o] == group[r])) others.push_back(compute_ms[o]);
    if (others.empty()) continue;
    std::sort(others.begin(), others.end());
    const size_t m = others.size();
    const double median = m % 2 ? others[m / 2] : 0.5 * (others[m / 2 - 1] + others[m / 2]);
    scores[r] = median > 0 ? compute_ms[r] / median : 1.0;
  }
  return scores;
}

std::vector<int> StragglerTracker::Update(const std::vector<double>& compute_ms,
                                          const std::vector<int>& group) {
  scores_ = StragglerScores(compute_ms, group);
  streak_.resize(scores_.size(), 0);
  std::vector<int> named;
  for (size_t r = 0; r < scores_.size(); ++r) {
    streak_[r] = scores_[r] > ratio_ ? streak_[r] + 1 : 0;
    if (streak_[r] == checks_) named.push_back(int(r));
  }
  return named;
}

}  // namespace keel::resilience

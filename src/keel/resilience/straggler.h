// Stragglers: ranks whose compute (a step's time less its waits for data and for other ranks) is
// slower than their peers'. Each check takes every rank's compute time over the last interval;
// a rank's score is its time over the median of the others' (2.0: twice as slow as a typical
// peer; the median of the others, so that one slow rank of two still scores its true factor).
// Peers are the ranks of the same group: a pipeline's stages do different work (the last one the
// head and the loss), so a rank is compared only with the ranks of its own stage; one alone in
// its group scores 1.
//
//   StragglerTracker t(/*ratio=*/1.3, /*checks=*/3);
//   for (int r : t.Update(compute_ms_per_rank)) report r, t.scores()[r] ...
#pragma once

#include <vector>

namespace keel::resilience {

// `group[r]`: rank r's group (empty: one group of all).
std::vector<double> StragglerScores(const std::vector<double>& compute_ms,
                                    const std::vector<int>& group = {});

class StragglerTracker {
 public:
  StragglerTracker(double ratio, int checks) : ratio_(ratio), checks_(checks) {}
  // The ranks slower than `ratio` for `checks` checks in a row, after this one; each is reported
  // once per streak (when it reaches `checks`).
  std::vector<int> Update(const std::vector<double>& compute_ms,
                          const std::vector<int>& group = {});
  const std::vector<double>& scores() const { return scores_; }
  const std::vector<int>& streaks() const { return streak_; }

 private:
  double ratio_;
  int checks_;
  std::vector<double> scores_;
  std::vector<int> streak_;
};

}  // namespace keel::resilience

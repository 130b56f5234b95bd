// The time left to a run's last step, from the recent steps' pace.
//
//   monitor::Eta eta;
//   eta.Add(step_ms);
//   eta.SecondsLeft(steps_left);   // -1 before the first step
//   FormatDuration(3725) == "1h02m"       (core/progress.h)
#pragma once

#include <deque>
#include <string>

#include "keel/core/progress.h"

namespace keel::monitor {

class Eta {
 public:
  explicit Eta(size_t window = 20) : window_(window) {}
  void Add(double step_ms);
  // The median of the last `window` steps times the steps left: a checkpoint or validation step
  // moves it less than a mean would.
  double SecondsLeft(long steps_left) const;

 private:
  size_t window_;
  std::deque<double> ms_;
};

}  // namespace keel::monitor

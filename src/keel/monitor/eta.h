// The time left to a run's last step, from the recent steps' pace.
//
//   monitor::Eta eta;
//   eta.Add(step_ms);
//   eta.SecondsLeft(steps_left);   // -1 before the first step
//   FormatDuration(3725) == "1h02m"
#pragma once

#include <deque>
#include <string>

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

// "42s", "3m05s", "1h02m", "2d03h".
std::string FormatDuration(double seconds);

}  // namespace keel::monitor

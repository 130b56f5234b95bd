// Loss and gradient-norm spikes: a value far above the recent window, by two measures at once so
// that neither a flat window (tiny deviation) nor a noisy one (large deviation) misfires: its
// z-score against the window's mean and deviation, and its ratio to the window's median.
//
//   SpikeDetector loss({.window = 50, .min_samples = 20, .z = 6, .ratio = 1.5});
//   if (auto why = loss.Check(x)) roll back ...; else loss.Add(x);
#pragma once

#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace keel::resilience {

struct SpikeRule {
  int window = 50;       // values kept
  int min_samples = 20;  // no verdict before this many
  double z = 6.0;        // (x - mean) / deviation above this ...
  double ratio = 1.5;    // ... and x / median above this: a spike
};

class SpikeDetector {
 public:
  SpikeDetector(std::string what, SpikeRule rule) : what_(std::move(what)), rule_(rule) {}
  // Why `x` is a spike ("loss 9.2100 is 14.2 deviations above ..."), or nullopt. A non-finite x
  // is not judged here (the non-finite check owns it).
  std::optional<std::string> Check(double x) const;
  void Add(double x);
  // The window, saved with each checkpoint so that a resume judges the next step alike.
  nlohmann::json ToJson() const { return values_; }
  void FromJson(const nlohmann::json& j);
  size_t size() const { return values_.size(); }

 private:
  std::string what_;
  SpikeRule rule_;
  std::deque<double> values_;
};

}  // namespace keel::resilience

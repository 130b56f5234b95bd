// Per-kernel time accounting for benchmarks: off by default (one branch per kernel call), on in
// bench/ to show where a step's time goes.
//
//   { ProfileScope p("matmul"); ... }     // adds the scope's time to "matmul" when enabled
//   ProfileReport(steps)                    // {"matmul": ms per step, ...}
#pragma once

#include <map>
#include <string>

#include "keel/core/timer.h"

namespace keel::kernels {

void ProfileReset(bool enable);
bool ProfileEnabled();
void ProfileAdd(const char* name, double ms);
std::map<std::string, double> ProfileReport(int steps);

class ProfileScope {
 public:
  explicit ProfileScope(const char* name) : name_(ProfileEnabled() ? name : nullptr) {}
  ~ProfileScope() {
    if (name_) ProfileAdd(name_, t_.Millis());
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  const char* name_;
  Timer t_;
};

}  // namespace keel::kernels

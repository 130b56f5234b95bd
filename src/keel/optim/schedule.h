// Learning-rate schedules: linear warmup from 0, then cosine or linear decay to a floor.
//
//   LrSchedule s{.kind = LrSchedule::kCosine, .max_lr = 6e-4, .min_lr = 6e-5, .warmup = 10,
//                .total = 1000};
//   float lr = s.At(step);   // step counts from 0
#pragma once

#include <string>

namespace keel::optim {

struct LrSchedule {
  enum Kind { kCosine, kLinear, kConstant };
  Kind kind = kCosine;
  float max_lr = 6e-4f;
  float min_lr = 6e-5f;
  int warmup = 0;
  int total = 1;

  float At(int step) const;
  static Kind ParseKind(const std::string& s);  // throws on an unknown name
};

}  // namespace keel::optim

#include "keel/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "keel/core/error.h"

namespace keel::optim {

float LrSchedule::At(int step) const {
  // Warmup reaches max_lr at step `warmup - 1`, so step 0 already trains (lr > 0).
  if (step < warmup) return max_lr * float(step + 1) / float(warmup);
  if (kind == kConstant) return max_lr;
  const int decay_steps = std::max(1, total - warmup);
  const float progress = std::min(1.0f, float(step - warmup) / float(decay_steps));
  const float shape =
      kind == kCosine ? 0.5f * (1.0f + std::cos(float(M_PI) * progress)) : 1.0f - progress;
  return min_lr + (max_lr - min_lr) * shape;
}

LrSchedule::Kind LrSchedule::ParseKind(const std::string& s) {
  if (s == "cosine") return kCosine;
  if (s == "linear") return kLinear;
  if (s == "constant") return kConstant;
  ThrowBadInput("[optim] schedule: expected \"cosine\", \"linear\" or \"constant\", got \"" + s +
                "\"");
}

}  // namespace keel::optim

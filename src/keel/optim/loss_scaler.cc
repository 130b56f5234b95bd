#include "keel/optim/loss_scaler.h"

#include <algorithm>

namespace keel::optim {

LossScaler::LossScaler(const LossScalerConfig& cfg) : cfg_(cfg) {
  st_.scale = cfg.initial;
  st_.hysteresis_tracker = cfg.hysteresis;
}

void LossScaler::Update(bool overflow) {
  if (overflow) {
    st_.growth_tracker = 0;
    st_.steps_at_minimum = st_.scale <= cfg_.min ? st_.steps_at_minimum + 1 : 0;
    if (--st_.hysteresis_tracker <= 0) st_.scale = std::max(st_.scale * cfg_.backoff, cfg_.min);
    return;
  }
  st_.steps_at_minimum = 0;
  // >=: a state saved under a longer growth_interval than the one resumed with still grows.
  if (++st_.growth_tracker >= cfg_.growth_interval) {
    st_.growth_tracker = 0;
    st_.hysteresis_tracker = cfg_.hysteresis;
    st_.scale *= cfg_.growth;
  }
}

}  // namespace keel::optim

// Dynamic loss scaling (Micikevicius et al. 2018), with Megatron-LM's DynamicGradScaler semantics
// (DeepSpeed's are the same): the loss gradient's seed is multiplied by `scale`; a step whose
// gradients overflow (a non-finite global norm of a finite loss) is skipped, and after
// `hysteresis` overflows since the last growth the scale backs off (×backoff, not below `min`);
// `growth_interval` clean steps in a row grow it (×growth) and re-arm the hysteresis.
//
// At the minimum the scaler can do no more: the trainer hands such steps to its non-finite guard
// (skip, roll back, stop: [resilience]) unless an fp16 run may still switch to bf16, where they
// are skipped and counted (steps_at_minimum) until it does. DeepSpeed's runs die there instead
// ("Current loss scale already at minimum"); skipping forever would end a run whose gradients
// are NaN for another reason with exit 0 and weights that stopped at the first NaN.
//
//   LossScaler s(cfg);
//   backward with dloss · s.scale(); norm = GradNorm() / s.scale();
//   const bool overflow = !std::isfinite(norm);
//   s.Update(overflow);            // skip the update when true; unscale by 1/scale otherwise
#pragma once

namespace keel::optim {

struct LossScalerConfig {
  double initial = 65536;  // 2^16
  double min = 1;
  double growth = 2;
  double backoff = 0.5;
  int growth_interval = 1000;
  int hysteresis = 2;
};

struct LossScalerState {
  double scale = 65536;
  int growth_tracker = 0;      // clean steps since the last overflow or growth
  int hysteresis_tracker = 2;  // overflows left before the next backoff
  int steps_at_minimum = 0;    // overflows in a row at the minimum scale
  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& cfg);
  double scale() const { return st_.scale; }
  bool at_minimum() const { return st_.scale <= cfg_.min; }
  // After a step: `overflow` when its gradients were not finite (the step is skipped).
  void Update(bool overflow);
  const LossScalerState& state() const { return st_; }
  void Restore(const LossScalerState& st) { st_ = st; }

 private:
  LossScalerConfig cfg_;
  LossScalerState st_;
};

}  // namespace keel::optim

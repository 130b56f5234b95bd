#include "keel/optim/adamw.h"

#include <cmath>

namespace keel::optim {

AdamW::AdamW(std::vector<ParamRange> ranges, size_t total, const AdamWHyper& hyper,
             const kernels::Backend& be)
    : ranges_(std::move(ranges)),
      total_(total),
      hyper_(hyper),
      be_(&be),
      m_(Buffer::Zeroed(be, total * 4)),
      v_(Buffer::Zeroed(be, total * 4)) {}

void AdamW::Step(float* master, bf16* working, const float* grads, float lr, float grad_scale) {
  ++step_;
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = hyper_.beta1;
  p.beta2 = hyper_.beta2;
  p.eps = hyper_.eps;
  p.grad_scale = grad_scale;
  p.step = step_;
  for (const ParamRange& r : ranges_) {
    if (r.frozen) continue;
    p.weight_decay = r.decay ? hyper_.weight_decay : 0.0f;
    float* mm = m() + r.offset;
    float* vv = v() + r.offset;
    be_->AdamWUpdate(master + r.offset, working ? working + r.offset : nullptr, mm, vv,
                     grads + r.offset, r.numel, p);
  }
}

double GlobalGradNorm(const float* grads, size_t n) {
  return std::sqrt(kernels::Cpu().SumSquares(grads, n));
}

float ClipScale(double norm, float max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return float(max_norm / (norm + 1e-6));
}

}  // namespace keel::optim

#include "keel/optim/adamw.h"

#include <algorithm>
#include <cmath>

namespace keel::optim {

AdamW::AdamW(std::vector<ParamRange> ranges, size_t total, const AdamWHyper& hyper,
             const kernels::Backend& be, bool own_moments)
    : ranges_(std::move(ranges)),
      total_(total),
      hyper_(hyper),
      be_(&be),
      m_(Buffer::Zeroed(be, own_moments ? total * DTypeSize(moment_dtype()) : 0)),
      v_(Buffer::Zeroed(be, own_moments ? total * DTypeSize(moment_dtype()) : 0)) {}

uint64_t RoundStream(const std::string& name, int tp_rank) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return kernels::SplitMix64(h + uint64_t(tp_rank) * 0x9E3779B97F4A7C15ull);
}

void AdamW::Step(float* master, bf16* working, const void* grads, float lr, float grad_scale) {
  Begin();
  Apply({master, working, m(), v(), grads, 0, total_}, lr, grad_scale);
}

void AdamW::Apply(const Slice& s, float lr, float grad_scale) const {
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = hyper_.beta1;
  p.beta2 = hyper_.beta2;
  p.eps = hyper_.eps;
  p.grad_scale = grad_scale;
  p.step = step_;
  const size_t mb = DTypeSize(moment_dtype()), gb = DTypeSize(grad_dtype());
  const uint64_t step_key = kernels::SplitMix64(hyper_.seed ^ (uint64_t(step_) << 32));
  for (const ParamRange& r : ranges_) {
    const size_t a = std::max(s.lo, r.offset), b = std::min(s.lo + s.n, r.offset + r.numel);
    if (r.frozen || a >= b) continue;
    const size_t at = a - s.lo;  // in the slice's pointers
    p.weight_decay = r.decay ? hyper_.weight_decay : 0.0f;
    p.round_key = kernels::SplitMix64(step_key + r.stream);
    p.index0 = r.first + (a - r.offset);
    kernels::AdamWState k;
    k.master = s.master ? s.master + at : nullptr;
    k.working = s.working ? s.working + at : nullptr;
    k.m = static_cast<char*>(s.m) + mb * at;
    k.v = static_cast<char*>(s.v) + mb * at;
    k.bf16_moments = hyper_.bf16_moments;
    k.grad = static_cast<const char*>(s.grads) + gb * at;
    k.bf16_grads = hyper_.bf16_grads;
    be_->AdamWUpdate(k, b - a, p);
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

#include "keel/optim/adamw.h"

#include <cmath>

namespace keel::optim {

AdamW::AdamW(std::vector<ParamRange> ranges, size_t total, const AdamWHyper& hyper,
             const kernels::Backend& be)
    : ranges_(std::move(ranges)),
      total_(total),
      hyper_(hyper),
      be_(&be),
      m_(Buffer::Zeroed(be, total * DTypeSize(moment_dtype()))),
      v_(Buffer::Zeroed(be, total * DTypeSize(moment_dtype()))) {}

uint64_t RoundStream(const std::string& name, int tp_rank) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return kernels::SplitMix64(h + uint64_t(tp_rank) * 0x9E3779B97F4A7C15ull);
}

void AdamW::Step(float* master, bf16* working, const float* grads, float lr, float grad_scale) {
  ++step_;
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = hyper_.beta1;
  p.beta2 = hyper_.beta2;
  p.eps = hyper_.eps;
  p.grad_scale = grad_scale;
  p.step = step_;
  const size_t mb = DTypeSize(moment_dtype());
  const uint64_t step_key = kernels::SplitMix64(hyper_.seed ^ (uint64_t(step_) << 32));
  for (const ParamRange& r : ranges_) {
    if (r.frozen) continue;
    p.weight_decay = r.decay ? hyper_.weight_decay : 0.0f;
    p.round_key = kernels::SplitMix64(step_key + r.stream);
    p.index0 = r.first;
    kernels::AdamWState s;
    s.master = master ? master + r.offset : nullptr;
    s.working = working ? working + r.offset : nullptr;
    s.m = static_cast<char*>(m()) + mb * r.offset;
    s.v = static_cast<char*>(v()) + mb * r.offset;
    s.bf16_moments = hyper_.bf16_moments;
    s.grad = grads + r.offset;
    be_->AdamWUpdate(s, r.numel, p);
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

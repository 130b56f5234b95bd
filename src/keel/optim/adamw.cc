#include "keel/optim/adamw.h"

#include <cmath>
#include <cstring>

#include "keel/kernels/adamw.h"

namespace keel::optim {

AdamW::AdamW(std::vector<ParamRange> ranges, size_t total, const AdamWHyper& hyper)
    : ranges_(std::move(ranges)), total_(total), hyper_(hyper), m_(total * 4), v_(total * 4) {
  std::memset(m_.data(), 0, m_.bytes());
  std::memset(v_.data(), 0, v_.bytes());
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
  for (const ParamRange& r : ranges_) {
    if (r.frozen) continue;
    p.weight_decay = r.decay ? hyper_.weight_decay : 0.0f;
    float* mm = m() + r.offset;
    float* vv = v() + r.offset;
    if (working)
      kernels::AdamWUpdate(master + r.offset, working + r.offset, mm, vv, grads + r.offset, r.numel,
                           p);
    else
      kernels::AdamWUpdate(master + r.offset, mm, vv, grads + r.offset, r.numel, p);
  }
}

double GlobalGradNorm(const float* grads, size_t n) { return std::sqrt(GradSquares(grads, n)); }

double GradSquares(const float* grads, size_t n) {
  constexpr size_t kBlock = 1 << 16;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t i = lo; i < hi; ++i) s += double(grads[i]) * grads[i];
    partial[b] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

float ClipScale(double norm, float max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return float(max_norm / (norm + 1e-6));
}

}  // namespace keel::optim

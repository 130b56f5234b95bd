// AdamW update on fp32 master weights; the formula is in adamw.h.
//
// Legend: n parameters.
//
// One pass over master, m, v and grad, and (bf16 runs) a write of the rounded master into the
// working copy. The working copy is only written, never read: each step starts from the fp32
// master, so updates far below bf16's resolution (2^-8 relative) still add up.
#include "keel/kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "keel/core/error.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

// kWriteWorking selects at compile time whether the working copy is written, so that the fp32
// loop carries no per-element branch.
template <bool kWriteWorking>
void AdamWLoop(float* master, bf16* working, float* m, float* v, const float* grad, size_t n,
               const AdamWParams& p) {
  KEEL_CHECK(p.step >= 1, "AdamW step counts from 1 (bias correction divides by 1 - beta^step)");
  // Bias corrections in float64: beta^step for step ~1e5 loses digits in float32.
  const float bias_correction1 = float(1.0 - std::pow(double(p.beta1), p.step));
  const float bias_correction2 = float(1.0 - std::pow(double(p.beta2), p.step));
  const float beta1 = p.beta1, beta2 = p.beta2, eps = p.eps;
  const float lr = p.lr, weight_decay = p.weight_decay, grad_scale = p.grad_scale;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / bias_correction1;
    const float v_hat = vi / bias_correction2;
    const float w = master[i];
    const float updated = w - lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * w);
    master[i] = updated;
    if constexpr (kWriteWorking) working[i] = ToBf16(updated);
  }
}

}  // namespace

void AdamWUpdate(float* master, float* m, float* v, const float* grad, size_t n,
                 const AdamWParams& p) {
  AdamWLoop<false>(master, nullptr, m, v, grad, n, p);
}

void AdamWUpdate(float* master, bf16* working, float* m, float* v, const float* grad, size_t n,
                 const AdamWParams& p) {
  AdamWLoop<true>(master, working, m, v, grad, n, p);
}

double SumSquares(const float* grads, size_t n) {
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

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

// AdamW update on fp32 master weights, or on master-less bf16 ones; the formula is in adamw.h.
//
// Legend: n parameters.
//
// One pass over master, m, v and grad, and (bf16 runs) a write of the rounded master into the
// working copy. The working copy is only written, never read: each step starts from the fp32
// master, so updates far below bf16's resolution (2^-8 relative) still add up. Without a master
// the bf16 weights are read and written, stochastically rounded: tiny updates then add up in
// expectation instead (core/dtype.h's StochasticRoundBf16).
#include "keel/kernels/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "keel/core/error.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

// Which weights the update reads and writes.
enum class Weights { kMaster, kMasterAndWorking, kWorkingOnly };

// The moment and gradient types and the weights are compile-time, so that no loop carries a
// per-element branch.
template <typename M, typename G, Weights kW>
void AdamWLoop(const AdamWState& s, size_t n, const AdamWParams& p) {
  KEEL_CHECK(p.step >= 1, "AdamW step counts from 1 (bias correction divides by 1 - beta^step)");
  // Bias corrections in float64: beta^step for step ~1e5 loses digits in float32.
  const float bias_correction1 = float(1.0 - std::pow(double(p.beta1), p.step));
  const float bias_correction2 = float(1.0 - std::pow(double(p.beta2), p.step));
  const float beta1 = p.beta1, beta2 = p.beta2, eps = p.eps;
  const float lr = p.lr, weight_decay = p.weight_decay, grad_scale = p.grad_scale;
  constexpr bool kMaster = kW != Weights::kWorkingOnly;
  constexpr bool kRound = std::is_same_v<M, bf16> || !kMaster;
  float* master = s.master;
  bf16* working = s.working;
  M* m = static_cast<M*>(s.m);
  M* v = static_cast<M*>(s.v);
  const G* grad = static_cast<const G*>(s.grad);
  const uint64_t key = p.round_key, index0 = p.index0;
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    RoundDraws r{};
    if constexpr (kRound) r = RoundDrawsOf(key, index0 + i);
    const float g = ToFloat(grad[i]) * grad_scale;
    const float mi = beta1 * ToFloat(m[i]) + (1.0f - beta1) * g;
    const float vi = beta2 * ToFloat(v[i]) + (1.0f - beta2) * g * g;
    if constexpr (std::is_same_v<M, bf16>) {
      m[i] = StochasticRoundBf16(mi, r.m);
      v[i] = StochasticRoundBf16(vi, r.v);
    } else {
      m[i] = mi;
      v[i] = vi;
    }
    const float m_hat = mi / bias_correction1;
    const float v_hat = vi / bias_correction2;
    const float w = kMaster ? master[i] : ToFloat(working[i]);
    const float updated = w - lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * w);
    if constexpr (kMaster) {
      master[i] = updated;
      if constexpr (kW == Weights::kMasterAndWorking) working[i] = ToBf16(updated);
    } else {
      working[i] = StochasticRoundBf16(updated, r.w);
    }
  }
}

template <typename G, Weights kW>
void AdamWMoments(const AdamWState& s, size_t n, const AdamWParams& p) {
  s.bf16_moments ? AdamWLoop<bf16, G, kW>(s, n, p) : AdamWLoop<float, G, kW>(s, n, p);
}

template <Weights kW>
void AdamWGrads(const AdamWState& s, size_t n, const AdamWParams& p) {
  s.bf16_grads ? AdamWMoments<bf16, kW>(s, n, p) : AdamWMoments<float, kW>(s, n, p);
}

// Σ x² of fp32 or bf16 values (widened exactly), in fixed blocks of 2^16 added in order.
template <typename T>
double SumSquaresOf(const T* x, size_t n) {
  constexpr size_t kBlock = 1 << 16;
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks);
#pragma omp parallel for schedule(static)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (size_t i = lo; i < hi; ++i) {
      const double v = ToFloat(x[i]);
      s += v * v;
    }
    partial[b] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

void AdamWUpdate(const AdamWState& s, size_t n, const AdamWParams& p) {
  KEEL_CHECK(s.master || s.working, "AdamW: neither master nor working weights");
  if (!s.master) return AdamWGrads<Weights::kWorkingOnly>(s, n, p);
  if (s.working) return AdamWGrads<Weights::kMasterAndWorking>(s, n, p);
  AdamWGrads<Weights::kMaster>(s, n, p);
}

void AdamWUpdate(float* master, float* m, float* v, const float* grad, size_t n,
                 const AdamWParams& p) {
  AdamWUpdate(AdamWState{master, nullptr, m, v, false, grad}, n, p);
}

void AdamWUpdate(float* master, bf16* working, float* m, float* v, const float* grad, size_t n,
                 const AdamWParams& p) {
  AdamWUpdate(AdamWState{master, working, m, v, false, grad}, n, p);
}

double SumSquares(const float* x, size_t n) { return SumSquaresOf(x, n); }
double SumSquares(const bf16* x, size_t n) { return SumSquaresOf(x, n); }

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

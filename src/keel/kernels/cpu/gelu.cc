// GELU (tanh approximation) forward/backward; the contract is in gelu.h.
//
// Legend: n elements (B*T*4C in GPT-2's MLP).
//
// Uses 0.5·(1 + tanh(u)) = σ(2u) = 1 / (1 + exp(-2u)), so that
//   gelu(x)  = x·σ(2u),                      u = √(2/π)·(x + 0.044715·x³)
//   gelu'(x) = σ + 2·x·σ·(1 - σ)·du/dx,       du/dx = √(2/π)·(1 + 3·0.044715·x²)
// (sech²(u) = 4σ(1-σ)). One exp per element, and no 1 + tanh(u) cancellation for large negative x.
// The exp is vec_math.h's ExpApprox, which GCC inlines and vectorizes; libm's tanhf/expf stay
// scalar calls without -ffast-math and would make GELU several times slower than its memory
// traffic.
#include "keel/kernels/cpu/gelu.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"
#include "keel/kernels/cpu/vec_math.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// σ(2u) = 0.5·(1 + tanh(u)), with u = u(x) as above.
inline float HalfOnePlusTanh(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 1.0f / (1.0f + ExpApprox(-2.0f * u));
}

}  // namespace

template <typename T>
void GeluForward(T* out, const T* inp, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float x = ToFloat(inp[i]);
    out[i] = FromFloat<T>(x * HalfOnePlusTanh(x));
  }
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) {
    const float x = ToFloat(inp[i]);
    const float s = HalfOnePlusTanh(x);
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    dinp[i] = FromFloat<T>(ToFloat(dout[i]) * (s + 2.0f * x * s * (1.0f - s) * du_dx));
  }
}

template void GeluForward<float>(float*, const float*, size_t);
template void GeluForward<bf16>(bf16*, const bf16*, size_t);
template void GeluForward<f16>(f16*, const f16*, size_t);
template void GeluBackward<float>(float*, const float*, const float*, size_t);
template void GeluBackward<bf16>(bf16*, const bf16*, const bf16*, size_t);
template void GeluBackward<f16>(f16*, const f16*, const f16*, size_t);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

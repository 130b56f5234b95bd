// SwiGLU forward/backward; the contract is in swiglu.h.
//
// Legend: N rows, F hidden units; g gate, u up, s = σ(g) = 1 / (1 + e^-g).
//   out = g·s·u;  ∂out/∂u = g·s;  ∂out/∂g = u·s·(1 + g·(1 − s)).
// The exp is vec_math.h's ExpApprox (vectorized, ~2e-7 relative), as in GELU.
#include "keel/kernels/cpu/swiglu.h"

#include <cstddef>

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"
#include "keel/kernels/cpu/vec_math.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

inline float Sigmoid(float g) { return 1.0f / (1.0f + ExpApprox(-g)); }

}  // namespace

template <typename T>
void SwigluForward(T* out, const T* gate_up, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* g = gate_up + size_t(i) * 2 * F;
    const T* u = g + F;
    T* y = out + size_t(i) * F;
#pragma omp simd
    for (int f = 0; f < F; ++f) {
      const float x = ToFloat(g[f]);
      y[f] = FromFloat<T>(x * Sigmoid(x) * ToFloat(u[f]));
    }
  }
}

template <typename T>
void SwigluBackward(T* dgate_up, const T* gate_up, const T* dout, int N, int F) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* g = gate_up + size_t(i) * 2 * F;
    const T* u = g + F;
    const T* dy = dout + size_t(i) * F;
    T* dg = dgate_up + size_t(i) * 2 * F;
    T* du = dg + F;
#pragma omp simd
    for (int f = 0; f < F; ++f) {
      const float x = ToFloat(g[f]), s = Sigmoid(x), d = ToFloat(dy[f]);
      dg[f] = FromFloat<T>(d * ToFloat(u[f]) * s * (1.0f + x * (1.0f - s)));
      du[f] = FromFloat<T>(d * x * s);
    }
  }
}

template void SwigluForward<float>(float*, const float*, int, int);
template void SwigluForward<bf16>(bf16*, const bf16*, int, int);
template void SwigluForward<f16>(f16*, const f16*, int, int);
template void SwigluBackward<float>(float*, const float*, const float*, int, int);
template void SwigluBackward<bf16>(bf16*, const bf16*, const bf16*, int, int);
template void SwigluBackward<f16>(f16*, const f16*, const f16*, int, int);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

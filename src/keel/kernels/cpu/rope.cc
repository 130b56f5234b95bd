// Rotary position embedding forward/backward; the contract is in rope.h.
//
// Legend: B batch, T time, NH query heads, NKV key/value heads, hs head size, h2 = hs/2.
// The cos/sin table (T × h2) depends on the positions only: built in float64 when they change,
// then shared by every sequence, head and call.
#include "keel/kernels/cpu/rope.h"

#include <cmath>
#include <cstddef>

#include "keel/kernels/cpu/scratch.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

// cos a and sin a for positions [pos0, pos0 + T) and i < h2, each position's h2 cosines then
// its h2 sines. Kept per thread for the last shape asked: a step's 2L calls share one table, and
// rebuilding it (2·T·h2 float64 pow, cos and sin, serial) was most of Llama 120M's RoPE time
// (11-12 ms a step, 4 ms without it).
const float* AngleTable(int T_, int hs, float theta, int pos0) {
  struct Key {
    int T_ = -1, hs = -1, pos0 = -1;
    float theta = 0;
    bool operator==(const Key&) const = default;
  };
  thread_local Key built;
  thread_local AlignedScratch<float> table;
  const int h2 = hs / 2;
  float* cs = table.Get(2 * size_t(T_) * h2);
  const Key want{T_, hs, pos0, theta};
  if (built == want) return cs;
  for (int t = 0; t < T_; ++t)
    for (int i = 0; i < h2; ++i) {
      const double a = double(pos0 + t) * std::pow(double(theta), -2.0 * i / hs);
      cs[2 * size_t(t) * h2 + i] = float(std::cos(a));
      cs[(2 * size_t(t) + 1) * h2 + i] = float(std::sin(a));
    }
  built = want;
  return cs;
}

// sign +1 rotates by the angle (forward), -1 by its negative (backward).
template <typename T>
void Rotate(T* qkv, int B, int T_, int NH, int NKV, int hs, float theta, int pos0, float sign) {
  const int h2 = hs / 2, row = (NH + 2 * NKV) * hs, heads = NH + NKV;
  const float* cs = AngleTable(T_, hs, theta, pos0);
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T_; ++bt) {
    const float* co = cs + 2 * size_t(bt % T_) * h2;
    const float* si = co + h2;
    for (int h = 0; h < heads; ++h) {
      T* x = qkv + size_t(bt) * row + size_t(h) * hs;
#pragma omp simd
      for (int i = 0; i < h2; ++i) {
        const float a = ToFloat(x[i]), b = ToFloat(x[i + h2]), s = sign * si[i];
        x[i] = FromFloat<T>(a * co[i] - b * s);
        x[i + h2] = FromFloat<T>(b * co[i] + a * s);
      }
    }
  }
}

}  // namespace

template <typename T>
void RopeForward(T* qkv, int B, int T_, int NH, int NKV, int hs, float theta, int pos0) {
  Rotate(qkv, B, T_, NH, NKV, hs, theta, pos0, 1.0f);
}

template <typename T>
void RopeBackward(T* dqkv, int B, int T_, int NH, int NKV, int hs, float theta, int pos0) {
  Rotate(dqkv, B, T_, NH, NKV, hs, theta, pos0, -1.0f);
}

template void RopeForward<float>(float*, int, int, int, int, int, float, int);
template void RopeForward<bf16>(bf16*, int, int, int, int, int, float, int);
template void RopeForward<f16>(f16*, int, int, int, int, int, float, int);
template void RopeBackward<float>(float*, int, int, int, int, int, float, int);
template void RopeBackward<bf16>(bf16*, int, int, int, int, int, float, int);
template void RopeBackward<f16>(f16*, int, int, int, int, int, float, int);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

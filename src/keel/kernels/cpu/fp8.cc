// fp8 emulation; the contracts are in fp8.h and core/fp8.h. Both passes are elementwise and
// vectorize: the rounding is core's RoundFp8 written without calls (a bit mask for normal values,
// an add and subtract of a power of two for subnormal ones, selects for the rest), which
// tests/kernels/fp8_test.cc checks against RoundFp8 on every bf16 value.
#include "keel/kernels/cpu/fp8.h"

#include <bit>
#include <cmath>
#include <cstdint>

// This copy's ISA from here on (isa_begin.h).
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

template <int kMbits, int kEmin>
inline float Round(float x, float max) {
  const float a = std::fabs(x);
  // Normal values: keep kMbits of the 23 mantissa bits, half to even on the bits.
  constexpr int kShift = 23 - kMbits;
  uint32_t u = std::bit_cast<uint32_t>(a);
  u += (1u << (kShift - 1)) - 1 + ((u >> kShift) & 1);
  u &= ~((1u << kShift) - 1);
  const float normal = std::bit_cast<float>(u);
  // Subnormal ones: a fixed quantum 2^(emin - mbits), the ulp of c, so a + c rounds to it.
  const float c = std::bit_cast<float>(uint32_t(kEmin - kMbits + 23 + 127) << 23);
  const float sub = (a + c) - c;
  const float small = std::bit_cast<float>(uint32_t(kEmin + 127) << 23);
  float r = a < small ? sub : normal;
  r = r > max ? max : r;  // saturate (also an infinity)
  r = std::copysign(r, x);
  return x != x ? x : r;  // NaN stays NaN
}

template <typename T, int kMbits, int kEmin>
void RoundAll(T* out, const T* in, size_t n, float scale, float max) {
  const float inv = 1.0f / scale;  // exact: scale is a power of two
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i)
    out[i] = FromFloat<T>(Round<kMbits, kEmin>(ToFloat(in[i]) * scale, max) * inv);
}

}  // namespace

template <typename T>
float AbsMax(const T* x, size_t n) {
  float m = 0;
  int nan = 0;
#pragma omp parallel for simd schedule(static) reduction(max : m) reduction(| : nan)
  for (size_t i = 0; i < n; ++i) {
    const float v = std::fabs(ToFloat(x[i]));
    m = v > m ? v : m;
    nan |= v != v;
  }
  return nan ? NAN : m;
}

template <typename T>
void Fp8Round(T* out, const T* in, size_t n, float scale, Fp8Format f) {
  if (f == Fp8Format::kE4M3)
    RoundAll<T, 3, -6>(out, in, n, scale, Fp8Max(f));
  else
    RoundAll<T, 2, -14>(out, in, n, scale, Fp8Max(f));
}

template float AbsMax<float>(const float*, size_t);
template float AbsMax<bf16>(const bf16*, size_t);
template float AbsMax<f16>(const f16*, size_t);
template void Fp8Round<float>(float*, const float*, size_t, float, Fp8Format);
template void Fp8Round<bf16>(bf16*, const bf16*, size_t, float, Fp8Format);
template void Fp8Round<f16>(f16*, const f16*, size_t, float, Fp8Format);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

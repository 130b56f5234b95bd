// Number formats: fp32, bf16 and fp16 (storage only; arithmetic is always fp32).
//
// bf16 is the upper half of an fp32. Conversion rounds to nearest, ties to even, and keeps NaN a
// NaN; StochasticRound adds a uniform 16-bit draw below the cut instead, so that many tiny
// updates add up in expectation. fp16 is IEEE binary16 (5 exponent bits: up to 65504, subnormals
// below 6.1e-5): conversion rounds to nearest even, overflows to infinity (which is what the loss
// scaler's overflow check needs to see) and keeps NaN a NaN. Where the compiler has _Float16
// (GCC 12 on x86-64) it converts, with F16C's vcvtps2ph/vcvtph2ps in the kernels' AVX2 and
// AVX-512 copies; elsewhere (nvcc's front end) by bits.
//
//   keel::bf16 h = keel::ToBf16(1.0f);
//   float f = keel::ToFloat(h);
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace keel {

struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2);

struct f16 {
  uint16_t bits;
};
static_assert(sizeof(f16) == 2);

enum class DType { kF32, kBF16, kF16 };

inline const char* DTypeName(DType t) {
  return t == DType::kF32 ? "fp32" : t == DType::kBF16 ? "bf16" : "fp16";
}
inline size_t DTypeSize(DType t) { return t == DType::kF32 ? 4 : 2; }

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<bf16>() {
  return DType::kBF16;
}
template <>
constexpr DType DTypeOf<f16>() {
  return DType::kF16;
}

inline float ToFloat(float x) { return x; }
inline float ToFloat(bf16 x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

// fp16 by bits: what ToFloat and ToF16 compute where the compiler has no _Float16 (and the
// reference the tests hold the compiler's conversion to).
inline float F16BitsToFloat(f16 x) {
  const uint32_t s = uint32_t(x.bits & 0x8000u) << 16, e = (x.bits >> 10) & 0x1fu,
                 m = x.bits & 0x3ffu;
  uint32_t u;
  if (e == 31) {
    u = s | 0x7f800000u | (m << 13);  // inf, NaN
  } else if (e != 0) {
    u = s | ((e + 112) << 23) | (m << 13);
  } else {  // zero or subnormal: m · 2^-24, exact in fp32
    const float f = float(m) * 5.9604644775390625e-8f;
    std::memcpy(&u, &f, 4);
    u |= s;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline f16 FloatToF16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t s = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{uint16_t(s | 0x7e00u | ((a >> 13) & 0x3ffu))};  // NaN
  if (a >= 0x477ff000u) return f16{uint16_t(s | 0x7c00u)};  // rounds to infinity
  if (a < 0x38800000u) {  // subnormal or zero: a · 2^24 rounded to an integer, ties to even
    float x;
    std::memcpy(&x, &a, 4);
    const float scaled = x * 16777216.0f;
    uint32_t q = uint32_t(scaled);
    const float rest = scaled - float(q);
    if (rest > 0.5f || (rest == 0.5f && (q & 1u))) ++q;
    return f16{uint16_t(s | q)};
  }
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return f16{uint16_t(s | (r >> 13))};
}

#if defined(__FLT16_MAX__) && !defined(__CUDACC__)
inline float ToFloat(f16 x) {
  _Float16 h;
  std::memcpy(&h, &x, 2);
  return float(h);
}
inline f16 ToF16(float f) {
  const _Float16 h = _Float16(f);
  f16 x;
  std::memcpy(&x, &h, 2);
  return x;
}
#else
inline float ToFloat(f16 x) { return F16BitsToFloat(x); }
inline f16 ToF16(float f) { return FloatToF16Bits(f); }
#endif

// `random16` is a uniform draw in [0, 2^16), e.g. from Philox.
inline bf16 StochasticRoundBf16(float f, uint32_t random16) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return ToBf16(f);
  u += random16 & 0xffffu;
  return bf16{uint16_t(u >> 16)};
}

// Store a float into T: the one place kernels round.
template <typename T>
inline T FromFloat(float f);
template <>
inline float FromFloat<float>(float f) {
  return f;
}
template <>
inline bf16 FromFloat<bf16>(float f) {
  return ToBf16(f);
}
template <>
inline f16 FromFloat<f16>(float f) {
  return ToF16(f);
}

// Bulk conversions (vectorized where the CPU allows).
void ConvertF32ToBf16(bf16* out, const float* in, size_t n);
void ConvertBf16ToF32(float* out, const bf16* in, size_t n);
void ConvertF32ToF16(f16* out, const float* in, size_t n);
void ConvertF16ToF32(float* out, const f16* in, size_t n);
// A 16-bit format's n values to fp32 and back (t: kBF16 or kF16).
void ConvertToF32(DType t, float* out, const void* in, size_t n);
void ConvertFromF32(DType t, void* out, const float* in, size_t n);

}  // namespace keel

// Number formats: fp32 and bf16 (storage only; arithmetic is always fp32).
//
// bf16 is the upper half of an fp32. Conversion rounds to nearest, ties to even, and keeps NaN a
// NaN; StochasticRound adds a uniform 16-bit draw below the cut instead, so that many tiny
// updates add up in expectation.
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

enum class DType { kF32, kBF16 };

inline const char* DTypeName(DType t) { return t == DType::kF32 ? "fp32" : "bf16"; }
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

// Bulk conversions (vectorized where the CPU allows).
void ConvertF32ToBf16(bf16* out, const float* in, size_t n);
void ConvertBf16ToF32(float* out, const bf16* in, size_t n);

}  // namespace keel

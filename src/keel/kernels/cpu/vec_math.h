// Vectorized exp for softmax-heavy loops: the classifier takes ~50 million exps per GPT-2 step,
// and libm's scalar exp would cost more than the matrix products around it.
//
// ExpApprox: Cody-Waite range reduction to 2^n · e^r with |r| ≤ ln2/2 and a degree-6 polynomial;
// max relative error ~2e-7 over the float range (tested against std::exp). Inputs below -87 give 0.
// NaN gives NaN: the clamps keep it (x86's max and min return their second operand when either is
// NaN, so x goes second), so that a corrupted logit or score reaches the sum it enters instead of
// vanishing as e^-87. Above 88 the scalar form gives +inf and the vector forms e^88 (1.65e38,
// finite): their callers (the classifier's and attention's softmax) pass x - max, never above 0,
// so a vector form needs an overflow mask before it serves an x that can be large.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

inline float ExpApprox(float x) {
  if (x < -87.0f) return 0.0f;
  if (x > 88.0f) return INFINITY;
  // Adding 1.5·2^23 rounds x·log2(e) to the nearest integer n (ties to even, as nearbyint) and
  // leaves n in the low mantissa bits, read back as bits: a NaN x flows through to a NaN result
  // with no float-to-int conversion, which is undefined for NaN.
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t bits;
  std::memcpy(&bits, &t, 4);
  bits = (bits - 0x4B400000u + 127u) << 23;  // n ∈ [-126, 127]: a normal 2^n
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// The vector forms exist only below isa_begin.h's pragma, where their instructions are enabled.
#if defined(KEEL_ISA_REGION) && defined(KEEL_ISA_AVX512)
inline __m512 ExpApprox16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(lo, x));  // NaN stays NaN (above)
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  __m512 e = _mm512_scalef_ps(p, n);
  return _mm512_mask_mov_ps(e, under, _mm512_setzero_ps());
}
#endif

#if defined(KEEL_ISA_REGION) && (defined(KEEL_ISA_AVX2) || defined(KEEL_ISA_AVX512))
// ExpApprox on 8 lanes; 2^n is built in the exponent bits (AVX2 has no scalef).
inline __m256 ExpApprox8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f);
  __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lo, x));  // NaN stays NaN
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // n ∈ [-126, 127] after the clamp (88·log2 e rounds to 127): 2^n is a normal float.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256 scale =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
  __m256 e = _mm256_mul_ps(p, scale);
  return _mm256_andnot_ps(under, e);
}
#endif

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

// Dequantization; the contract is in dequantize.h. One pass over the codes, a group at a time so
// that the scale is a loop constant and the inner loop vectorizes (int8: a widening convert and a
// multiply; NF4: a 16-entry table lookup per nibble, one permute on AVX-512). Bandwidth-bound: a
// byte (NF4: half) read and 2 or 4 written per weight, against the 2·rows FLOPs per weight of the
// product that follows.
#include "keel/kernels/cpu/dequantize.h"

#include <algorithm>

// This copy's ISA from here on (isa_begin.h).
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

// NF4: `n` (even) values from n/2 code bytes, times s, into `out` (fp32). A 16-entry table is one
// vpermps on AVX-512 (two and a blend on AVX2), so the lookups vectorize where a gather would
// not; the products are the scalar loop's (one IEEE multiply each), bit for bit.
void Nf4Values(float* out, const uint8_t* q, size_t n, float s) {
  size_t i = 0;
#if defined(KEEL_ISA_AVX512)
  const __m512 levels = _mm512_loadu_ps(kNf4Levels);
  const __m512 vs = _mm512_set1_ps(s);
  // The zero-masking forms, all lanes on: GCC 12 warns of the plain ones' undefined passthrough.
  const __mmask16 all = 0xFFFF;
  // Element 2j is byte j's low nibble, 2j+1 its high one: interleave the two lookups.
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (; i + 32 <= n; i += 32) {
    const __m512i b = _mm512_maskz_cvtepu8_epi32(
        all, _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i / 2)));
    const __m512 lo =
        _mm512_maskz_permutexvar_ps(all, _mm512_and_si512(b, _mm512_set1_epi32(15)), levels);
    const __m512 hi = _mm512_maskz_permutexvar_ps(all, _mm512_maskz_srli_epi32(all, b, 4), levels);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_permutex2var_ps(lo, first, hi), vs));
    _mm512_storeu_ps(out + i + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, second, hi), vs));
  }
#elif defined(KEEL_ISA_AVX2)
  const __m256 low8 = _mm256_loadu_ps(kNf4Levels), high8 = _mm256_loadu_ps(kNf4Levels + 8);
  const __m256 vs = _mm256_set1_ps(s);
  // Codes 8-15 from the second half: bit 3 moved to the sign bit selects it.
  auto lookup = [&](__m256i c) {
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(low8, c), _mm256_permutevar8x32_ps(high8, c),
                            _mm256_castsi256_ps(_mm256_slli_epi32(c, 28)));
  };
  for (; i + 16 <= n; i += 16) {
    const __m256i b =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i / 2)));
    const __m256 lo = lookup(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    const __m256 hi = lookup(_mm256_srli_epi32(b, 4));
    // unpack interleaves within 128-bit halves; permute2f128 puts the halves in order.
    const __m256 a = _mm256_unpacklo_ps(lo, hi), c = _mm256_unpackhi_ps(lo, hi);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_permute2f128_ps(a, c, 0x20), vs));
    _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(_mm256_permute2f128_ps(a, c, 0x31), vs));
  }
#endif
  for (; i < n; i += 2) {
    out[i] = s * kNf4Levels[q[i / 2] & 15];
    out[i + 1] = s * kNf4Levels[q[i / 2] >> 4];
  }
}

}  // namespace

template <typename T>
void Dequantize(T* out, const uint8_t* codes, const float* scales, size_t n, size_t group,
                QuantFormat f) {
  const size_t groups = (n + group - 1) / group;
#pragma omp parallel
  {
    std::vector<float> values(std::is_same_v<T, float> ? 0 : group);
#pragma omp for schedule(static)
    for (size_t g = 0; g < groups; ++g) {
      const size_t lo = g * group, len = std::min(n, lo + group) - lo;
      const float s = scales[g];
      T* y = out + lo;
      if (f == QuantFormat::kInt8) {
        const auto* q = reinterpret_cast<const int8_t*>(codes) + lo;
#pragma omp simd
        for (size_t i = 0; i < len; ++i) y[i] = FromFloat<T>(s * float(q[i]));
        continue;
      }
      // lo and len are even (groups of 64; dequantize.h), so each group starts on a byte.
      float* v = std::is_same_v<T, float> ? reinterpret_cast<float*>(y) : values.data();
      Nf4Values(v, codes + lo / 2, len, s);
      if constexpr (!std::is_same_v<T, float>) {
#pragma omp simd
        for (size_t i = 0; i < len; ++i) y[i] = FromFloat<T>(v[i]);
      }
    }
  }
}

template void Dequantize<float>(float*, const uint8_t*, const float*, size_t, size_t, QuantFormat);
template void Dequantize<bf16>(bf16*, const uint8_t*, const float*, size_t, size_t, QuantFormat);
template void Dequantize<f16>(f16*, const uint8_t*, const float*, size_t, size_t, QuantFormat);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

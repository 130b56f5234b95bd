// The tile arithmetic of the CPU attention (attention.cc): vectors as wide as this copy's
// registers, a vectorized exp, register-blocked small matrix products on zero-padded tiles (with
// the triangles a diagonal tile may skip) and square transposes. Kernel-private: included by
// attention.cc after isa_begin.h, so that it compiles for that copy's instruction set.
#pragma once

#if !defined(KEEL_ISA_REGION)
#error "attention_tiles.h belongs below isa_begin.h"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "keel/kernels/cpu/isa.h"
#include "keel/kernels/cpu/vec_math.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS::internal {

constexpr int kTile = 64;
constexpr size_t kTileArea = size_t(kTile) * kTile;

// GCC/Clang vector extensions as wide as this copy's registers: one zmm (16 floats), one ymm (8)
// or one xmm (4), so that one code path serves every target. Not 16 floats everywhere: GCC 12
// lowers a 64-byte vector on AVX2 into xmm pieces shuffled through the stack, which left the AVX2
// copy's attention at 7-10% of its roofline (GPT-2 124M fp32: 339 ms forward, 666 ms backward).
#if defined(KEEL_ISA_AVX512)
constexpr int kLanes = 16;
#elif defined(KEEL_ISA_AVX2)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using VecI = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Vec Load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void Store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
// Not Vec{} + x: adding 0 is not the identity for -0, so that would cost an add per broadcast.
inline Vec Splat(float x) {
#if defined(KEEL_ISA_AVX512)
  return _mm512_set1_ps(x);
#elif defined(KEEL_ISA_AVX2)
  return _mm256_set1_ps(x);
#else
  return _mm_set1_ps(x);
#endif
}
inline Vec Max(Vec a, Vec b) { return a > b ? a : b; }

// dst[c][r] = src[r][c] for r < rows, c < cols (multiples of kSquare), rows `lds` and `ldd` floats
// apart: squares transposed in registers. One float at a time, the transposes that feed the
// score products were a third of the attention's own time at the quickstart's shape (T = 128).
#if defined(KEEL_ISA_AVX512) || defined(KEEL_ISA_AVX2)
constexpr int kSquare = 8;
inline void TransposeSquare(float* dst, size_t ldd, const float* src, size_t lds) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    const __m256 a = _mm256_loadu_ps(src + i * lds), b = _mm256_loadu_ps(src + (i + 1) * lds);
    t[i] = _mm256_unpacklo_ps(a, b);      // a0 b0 a1 b1 | a4 b4 a5 b5
    t[i + 1] = _mm256_unpackhi_ps(a, b);  // a2 b2 a3 b3 | a6 b6 a7 b7
  }
  for (int h = 0; h < 8; h += 4) {  // rows h..h+3: columns c and c + 4 of them in u[h + c]
    u[h + 0] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int c = 0; c < 4; ++c) {
    _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(u[c], u[4 + c], 0x20));
    _mm256_storeu_ps(dst + (c + 4) * ldd, _mm256_permute2f128_ps(u[c], u[4 + c], 0x31));
  }
}
#else
constexpr int kSquare = 4;
inline void TransposeSquare(float* dst, size_t ldd, const float* src, size_t lds) {
  __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + lds), r2 = _mm_loadu_ps(src + 2 * lds),
         r3 = _mm_loadu_ps(src + 3 * lds);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(dst, r0);
  _mm_storeu_ps(dst + ldd, r1);
  _mm_storeu_ps(dst + 2 * ldd, r2);
  _mm_storeu_ps(dst + 3 * ldd, r3);
}
#endif
static_assert(kTile % kSquare == 0 && kLanes % kSquare == 0);

inline void Transpose(float* dst, size_t ldd, const float* src, size_t lds, int rows, int cols) {
  for (int r = 0; r < rows; r += kSquare)
    for (int c = 0; c < cols; c += kSquare)
      TransposeSquare(dst + size_t(c) * ldd + r, ldd, src + size_t(r) * lds + c, lds);
}

// a·b + c, fused where the target has it. Written out because -std=c++20 (not gnu++20) turns off
// the compiler's own contraction.
inline Vec Fma(Vec a, Vec b, Vec c) {
#if defined(KEEL_ISA_AVX512)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(KEEL_ISA_AVX2)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// GemmBlock's widest block: its 4 × NV accumulators, NV vectors of B and a broadcast must fit the
// register file (32 zmm; 16 ymm or xmm), or the block spills. On AVX2, NV = 3 (all 16 registers)
// ran GPT-2 124M's attention 10% faster than NV = 2.
#if defined(KEEL_ISA_AVX512)
constexpr int kMaxNV = 4;
#else
constexpr int kMaxNV = 3;
#endif

// e^x: vec_math.h's on AVX-512 and AVX2 (scalef builds 2^n in one instruction on AVX-512: the
// attention's forward 1-3% faster than this copy's own); on 4 lanes Cephes' polynomial after
// x = n·ln2 + r, about 2 ulp, 2^n built in the exponent bits. Inputs below -87, -inf included, give
// 0: softmax only exponentiates s − max ≤ 0 (or s − lse), where e^-87 ≈ 1.6e-38 is nothing. NaN
// gives NaN (a corrupted score must reach the output that reads it).
inline Vec Exp(Vec x) {
#if defined(KEEL_ISA_AVX512)
  return ExpApprox16(x);  // (attention.cc silences GCC 12's false warning about it)
#elif defined(KEEL_ISA_AVX2)
  return ExpApprox8(x);
#else
  const Vec lo = Splat(-87.0f);
  Vec xc = x < lo ? lo : x;
  xc = xc > Splat(88.0f) ? Splat(88.0f) : xc;
  // Adding 1.5·2^23 rounds x·log2(e) to an integer n and leaves n in the low mantissa bits.
  const float kMagic = 12582912.0f;
  Vec t = Fma(xc, Splat(1.44269504088896341f), Splat(kMagic));
  Vec n = t - kMagic;
  Vec r = Fma(n, Splat(-0.693359375f), xc);
  r = Fma(n, Splat(2.12194440e-4f), r);
  Vec p = Splat(1.9875691500e-4f);
  p = Fma(p, r, Splat(1.3981999507e-3f));
  p = Fma(p, r, Splat(8.3334519073e-3f));
  p = Fma(p, r, Splat(4.1665795894e-2f));
  p = Fma(p, r, Splat(1.6666665459e-1f));
  p = Fma(p, r, Splat(5.0000001201e-1f));
  p = Fma(p, r * r, r + 1.0f);
  VecI two_n = (((VecI)t - 0x4B400000) + 127) << 23;  // n ∈ [-126, 127]: a normal 2^n
  Vec y = p * (Vec)two_n;
  return x < lo ? Vec{} : y;
#endif
}

// C[m][n] = (or +=) Σ_k A(m, k)·B[k][n] for a block of 4 rows and NV vectors of columns. A(m, k) =
// a[m·a_rs + k·a_cs] is read one scalar at a time and broadcast, so any A layout (including a
// transposed view) is as fast; B and C rows are contiguous. The k order is fixed, which keeps
// every result independent of how work is split.
template <int NV>
inline void GemmBlock(float* c, ptrdiff_t ldc, const float* a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                      const float* b, ptrdiff_t ldb, int K, bool accumulate) {
  // Unrolled by hand-held pragmas so that acc lives in 4·NV registers, not on the stack.
  Vec acc[4][NV];
#pragma GCC unroll 4
  for (ptrdiff_t i = 0; i < 4; ++i)
#pragma GCC unroll 4
    for (ptrdiff_t v = 0; v < NV; ++v)
      acc[i][v] = accumulate ? Load(c + i * ldc + v * kLanes) : Vec{};
  for (ptrdiff_t k = 0; k < K; ++k) {
    Vec bv[NV];
#pragma GCC unroll 4
    for (ptrdiff_t v = 0; v < NV; ++v) bv[v] = Load(b + k * ldb + v * kLanes);
    const float* ak = a + k * a_cs;
#pragma GCC unroll 4
    for (ptrdiff_t i = 0; i < 4; ++i) {
      Vec ai = Splat(ak[i * a_rs]);
#pragma GCC unroll 4
      for (ptrdiff_t v = 0; v < NV; ++v) acc[i][v] = Fma(ai, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 4
  for (ptrdiff_t i = 0; i < 4; ++i)
#pragma GCC unroll 4
    for (ptrdiff_t v = 0; v < NV; ++v) Store(c + i * ldc + v * kLanes, acc[i][v]);
}

// Which part of a diagonal tile's product is needed. Above a tile's diagonal (key j after query
// r) P and dS are exactly zero and S is masked to -inf, so a diagonal tile skips those terms and
// does ~45% less work: 4 of a 256-step sequence's 10 tile pairs are diagonal. Skipped terms are
// exact zeros (0·x for finite x), and what is computed runs in the same k order, so results are
// those of the full product up to the sign of an exact zero.
enum class Tri {
  kFull,
  kColsFromRow,  // C[m][n] is read only for n ≥ m (rows keys, columns queries: S, dP)
  kKFromRow,     // A(m, k) = 0 for k < m (rows keys, k queries: dV, dK)
  kKToRow,       // A(m, k) = 0 for k > m (rows queries, k keys: dQ, the forward's O += P·V)
};

// Small matrix product on padded scratch: M % 4 == 0 and N % kLanes == 0 (callers pad with zeros).
// A triangular `tri` needs a diagonal tile's two kTile-long dimensions: kColsFromRow M = N,
// kKFromRow and kKToRow M = K (the third is hsp).
inline void Gemm(float* c, ptrdiff_t ldc, const float* a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                 const float* b, ptrdiff_t ldb, int M, int N, int K, bool accumulate,
                 Tri tri = Tri::kFull) {
  for (int m = 0; m < M; m += 4) {
    int n = 0, k0 = 0, k1 = K;
    if (tri == Tri::kColsFromRow) n = m / kLanes * kLanes;
    if (tri == Tri::kKFromRow) k0 = m;
    if (tri == Tri::kKToRow) k1 = std::min(K, m + 4);
    float* cm = c + size_t(m) * ldc;
    const float* am = a + size_t(m) * a_rs + k0 * a_cs;
    const float* bk = b + k0 * ldb;
    const int nk = k1 - k0;
    for (; n + kMaxNV * kLanes <= N; n += kMaxNV * kLanes)
      GemmBlock<kMaxNV>(cm + n, ldc, am, a_rs, a_cs, bk + n, ldb, nk, accumulate);
    switch ((N - n) / kLanes) {
      case 3:
        GemmBlock<3>(cm + n, ldc, am, a_rs, a_cs, bk + n, ldb, nk, accumulate);
        break;
      case 2:
        GemmBlock<2>(cm + n, ldc, am, a_rs, a_cs, bk + n, ldb, nk, accumulate);
        break;
      case 1:
        GemmBlock<1>(cm + n, ldc, am, a_rs, a_cs, bk + n, ldb, nk, accumulate);
        break;
      default:
        break;
    }
  }
}

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS::internal

// Causal multi-head self-attention on the CPU, flash-style (see attention.h for the contract).
//
// Legend: B batch, T time, C channels, NH heads, hs = C/NH head size, hsp = hs rounded up to a
// multiple of 16 (scratch rows are zero-padded so every inner loop runs on whole vectors).
// Tiles: kTile = 64 query rows (r, i0 + r) × 64 key rows (j, j0 + j). S scores, P
// probabilities, O output accumulator, D_i = Σ_d dout_i·out_i, m running max, l running sum.
// A trailing `t` marks a transposed scratch layout: St[j][r], Qt[d][r], Ot[d][r]. Holding the
// query index innermost lets the softmax statistics (one per query row) be plain vector ops.
//
// Parallelism and determinism: the forward splits (b, h, query tile) items across threads, and
// each item's arithmetic never depends on which thread runs it. The backward gives each (b, h) to
// one thread, which accumulates dq over key tiles and dk, dv over query tiles in a fixed order.
// Results are therefore bitwise identical for any thread count.
#include "keel/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace keel::kernels {
namespace {

constexpr int kTile = 64;
constexpr int kLanes = 16;

// GCC/Clang vector extensions: 16 floats, lowered to one zmm register with AVX-512 and split
// into narrower registers elsewhere, so that one code path serves every target.
using V16 = float __attribute__((vector_size(64)));
using V16i = int32_t __attribute__((vector_size(64)));

inline V16 Load(const float* p) {
  V16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void Store(float* p, V16 v) { std::memcpy(p, &v, sizeof v); }
inline V16 Splat(float x) { return V16{} + x; }
inline V16 Max(V16 a, V16 b) { return a > b ? a : b; }

// a·b + c, fused where the target has it. Written out because -std=c++20 (not gnu++20) turns off
// the compiler's own contraction.
inline V16 Fma(V16 a, V16 b, V16 c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// e^x, about 2 ulp (Cephes' polynomial after x = n·ln2 + r). Inputs below -87, -inf included, give
// 0: softmax only exponentiates s − max ≤ 0 (or s − lse), where e^-87 ≈ 1.6e-38 is nothing.
inline V16 Exp(V16 x) {
  const V16 lo = Splat(-87.0f);
  V16 xc = x < lo ? lo : x;
  xc = xc > Splat(88.0f) ? Splat(88.0f) : xc;
  // Adding 1.5·2^23 rounds x·log2(e) to an integer n and leaves n in the low mantissa bits.
  const float kMagic = 12582912.0f;
  V16 t = Fma(xc, Splat(1.44269504088896341f), Splat(kMagic));
  V16 n = t - kMagic;
  V16 r = Fma(n, Splat(-0.693359375f), xc);
  r = Fma(n, Splat(2.12194440e-4f), r);
  V16 p = Splat(1.9875691500e-4f);
  p = Fma(p, r, Splat(1.3981999507e-3f));
  p = Fma(p, r, Splat(8.3334519073e-3f));
  p = Fma(p, r, Splat(4.1665795894e-2f));
  p = Fma(p, r, Splat(1.6666665459e-1f));
  p = Fma(p, r, Splat(5.0000001201e-1f));
  p = Fma(p, r * r, r + 1.0f);
  V16i two_n = (((V16i)t - 0x4B400000) + 127) << 23;  // n ∈ [-126, 127]: a normal 2^n
  V16 y = p * (V16)two_n;
  return x < lo ? V16{} : y;
}

// C[m][n] = (or +=) Σ_k A(m, k)·B[k][n] for a block of 4 rows and NV·16 columns. A(m, k) =
// a[m·a_rs + k·a_cs] is read one scalar at a time and broadcast, so any A layout (including a
// transposed view) is as fast; B and C rows are contiguous. The k order is fixed, which keeps
// every result independent of how work is split.
template <int NV>
inline void GemmBlock(float* c, int ldc, const float* a, int a_rs, int a_cs, const float* b,
                      int ldb, int K, bool accumulate) {
  V16 acc[4][NV];
  for (int i = 0; i < 4; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = accumulate ? Load(c + i * ldc + v * kLanes) : V16{};
  for (int k = 0; k < K; ++k) {
    V16 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = Load(b + size_t(k) * ldb + v * kLanes);
    const float* ak = a + size_t(k) * a_cs;
    for (int i = 0; i < 4; ++i) {
      V16 ai = Splat(ak[i * a_rs]);
      for (int v = 0; v < NV; ++v) acc[i][v] = Fma(ai, bv[v], acc[i][v]);
    }
  }
  for (int i = 0; i < 4; ++i)
    for (int v = 0; v < NV; ++v) Store(c + i * ldc + v * kLanes, acc[i][v]);
}

// Small matrix product on padded scratch: M % 4 == 0 and N % 16 == 0 (callers pad with zeros).
void Gemm(float* c, int ldc, const float* a, int a_rs, int a_cs, const float* b, int ldb, int M,
          int N, int K, bool accumulate) {
  for (int m = 0; m < M; m += 4) {
    float* cm = c + size_t(m) * ldc;
    const float* am = a + size_t(m) * a_rs;
    int n = 0;
    for (; n + 4 * kLanes <= N; n += 4 * kLanes)
      GemmBlock<4>(cm + n, ldc, am, a_rs, a_cs, b + n, ldb, K, accumulate);
    switch ((N - n) / kLanes) {
      case 3:
        GemmBlock<3>(cm + n, ldc, am, a_rs, a_cs, b + n, ldb, K, accumulate);
        break;
      case 2:
        GemmBlock<2>(cm + n, ldc, am, a_rs, a_cs, b + n, ldb, K, accumulate);
        break;
      case 1:
        GemmBlock<1>(cm + n, ldc, am, a_rs, a_cs, b + n, ldb, K, accumulate);
        break;
      default:
        break;
    }
  }
}

// Per-thread scratch that only grows, so that steady-state training steps allocate nothing.
// Take() carves consecutive 64-byte-aligned pieces; Reset() starts over.
class Scratch {
 public:
  void Reserve(size_t floats) {
    if (floats > capacity_) {
      data_.reset(static_cast<float*>(std::aligned_alloc(64, RoundUp(floats) * sizeof(float))));
      capacity_ = RoundUp(floats);
    }
    used_ = 0;
  }
  float* Take(size_t floats) {
    float* p = data_.get() + used_;
    used_ += RoundUp(floats);
    return p;
  }
  static size_t RoundUp(size_t floats) { return (floats + kLanes - 1) / kLanes * kLanes; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t capacity_ = 0;
  size_t used_ = 0;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

int RoundUpTo(int x, int m) { return (x + m - 1) / m * m; }

// dst[0, hsp) = src[0, hs) in fp32, then zeros.
template <typename T>
inline void LoadRow(float* dst, const T* src, int hs, int hsp) {
  for (int d = 0; d < hs; ++d) dst[d] = ToFloat(src[d]);
  for (int d = hs; d < hsp; ++d) dst[d] = 0.0f;
}

// Rows [row0, row0 + nrows) of one head's q, k or v (src points at that head's channel 0 of time
// step 0, rows 3C apart) into a kTile × hsp row-major tile; rows past nrows are zero.
template <typename T>
void LoadTile(float* tile, const T* src, int row0, int nrows, int C3, int hs, int hsp,
              float scale = 1.0f) {
  for (int j = 0; j < nrows; ++j) {
    float* dst = tile + size_t(j) * hsp;
    LoadRow(dst, src + size_t(row0 + j) * C3, hs, hsp);
    if (scale != 1.0f)
      for (int d = 0; d < hs; ++d) dst[d] *= scale;
  }
  std::memset(tile + size_t(nrows) * hsp, 0, sizeof(float) * size_t(kTile - nrows) * hsp);
}

// Scores above the diagonal of a diagonal tile (key j after query r) never count.
inline void MaskDiagonal(float* St) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  for (int j = 1; j < kTile; ++j)
    for (int r = 0; r < j; ++r) St[j * kTile + r] = kNegInf;
}

}  // namespace

template <typename T>
void AttentionForward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH) {
  const int hs = C / NH, hsp = RoundUpTo(hs, kLanes), C3 = 3 * C;
  const int ntiles = (T_ + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(float(hs));
  const int nitems = B * NH * ntiles;
  // Items run from the last query tile (most key tiles) to the first, so that dynamic scheduling
  // ends with the small ones.
#pragma omp parallel for schedule(dynamic, 1)
  for (int item = 0; item < nitems; ++item) {
    const int qt = ntiles - 1 - item / (B * NH);
    const int b = item % (B * NH) / NH, h = item % NH;
    const int i0 = qt * kTile, nq = std::min(kTile, T_ - i0);
    const T* q_base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
    const T* k_base = q_base + C;
    const T* v_base = q_base + 2 * C;

    Scratch& scratch = ThreadScratch();
    scratch.Reserve(4 * Scratch::RoundUp(size_t(kTile) * hsp) + kTile * kTile + 2 * kTile);
    float* Qt = scratch.Take(size_t(hsp) * kTile);  // (hsp, kTile), pre-scaled by 1/√hs
    float* K = scratch.Take(size_t(kTile) * hsp);   // (kTile, hsp)
    float* V = scratch.Take(size_t(kTile) * hsp);   // (kTile, hsp)
    float* Ot = scratch.Take(size_t(hsp) * kTile);  // (hsp, kTile)
    float* St = scratch.Take(kTile * kTile);        // (kTile keys, kTile queries)
    float* m = scratch.Take(kTile);
    float* l = scratch.Take(kTile);

    std::memset(Qt, 0, sizeof(float) * size_t(hsp) * kTile);
    for (int r = 0; r < nq; ++r) {
      const T* q = q_base + size_t(i0 + r) * C3;
      for (int d = 0; d < hs; ++d) Qt[d * kTile + r] = ToFloat(q[d]) * scale;
    }
    std::memset(Ot, 0, sizeof(float) * size_t(hsp) * kTile);
    std::fill(m, m + kTile, -std::numeric_limits<float>::infinity());
    std::fill(l, l + kTile, 0.0f);

    for (int kt = 0; kt <= qt; ++kt) {
      const int j0 = kt * kTile, nk = std::min(kTile, T_ - j0);
      LoadTile(K, k_base, j0, nk, C3, hs, hsp);
      LoadTile(V, v_base, j0, nk, C3, hs, hsp);
      Gemm(St, kTile, K, hsp, 1, Qt, kTile, kTile, kTile, hsp, false);
      // Padded keys of the last tile sit above the diagonal of it, so the mask covers them too.
      if (kt == qt) MaskDiagonal(St);
      // Online softmax, 16 query rows at a time.
      for (int r = 0; r < kTile; r += kLanes) {
        V16 m_old = Load(m + r), m_new = m_old;
        for (int j = 0; j < kTile; ++j) m_new = Max(m_new, Load(St + j * kTile + r));
        V16 sum{};
        for (int j = 0; j < kTile; ++j) {
          V16 p = Exp(Load(St + j * kTile + r) - m_new);
          Store(St + j * kTile + r, p);
          sum += p;
        }
        V16 alpha = Exp(m_old - m_new);  // 0 on the first tile, where m_old = -inf
        Store(l + r, Fma(Load(l + r), alpha, sum));
        Store(m + r, m_new);
        for (int d = 0; d < hsp; ++d) Store(Ot + d * kTile + r, Load(Ot + d * kTile + r) * alpha);
      }
      // Ot[d][r] += Σ_j V[j][d]·P[j][r]
      Gemm(Ot, kTile, V, 1, hsp, St, kTile, hsp, kTile, kTile, true);
    }

    for (int r = 0; r < nq; ++r) {
      const size_t row = size_t(b) * T_ + i0 + r;
      const float inv_l = 1.0f / l[r];
      T* o = out + row * C + size_t(h) * hs;
      for (int d = 0; d < hs; ++d) o[d] = FromFloat<T>(Ot[d * kTile + r] * inv_l);
      lse[(size_t(b) * NH + h) * T_ + i0 + r] = m[r] + std::log(l[r]);
    }
  }
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                       int T_, int C, int NH) {
  const int hs = C / NH, hsp = RoundUpTo(hs, kLanes), C3 = 3 * C;
  const int ntiles = (T_ + kTile - 1) / kTile, Tp = ntiles * kTile;
  const float scale = 1.0f / std::sqrt(float(hs));
  const size_t head = size_t(Tp) * hsp;
#pragma omp parallel for schedule(dynamic, 1)
  for (int bh = 0; bh < B * NH; ++bh) {
    const int b = bh / NH, h = bh % NH;
    const T* q_base = qkv + size_t(b) * T_ * C3 + size_t(h) * hs;
    const T* do_base = dout + size_t(b) * T_ * C + size_t(h) * hs;
    const T* o_base = out + size_t(b) * T_ * C + size_t(h) * hs;
    const float* lse_bh = lse + size_t(bh) * T_;
    T* dq_base = dqkv + size_t(b) * T_ * C3 + size_t(h) * hs;

    Scratch& scratch = ThreadScratch();
    scratch.Reserve(7 * Scratch::RoundUp(head) + 2 * Scratch::RoundUp(size_t(kTile) * hsp) +
                    2 * kTile * kTile + 2 * size_t(Tp));
    // Whole-head copies in fp32, converted once: every query tile meets every earlier key tile.
    float* Q = scratch.Take(head);                  // (Tp, hsp), pre-scaled by 1/√hs
    float* Qt = scratch.Take(head);                 // (hsp, Tp), pre-scaled
    float* K = scratch.Take(head);                  // (Tp, hsp)
    float* V = scratch.Take(head);                  // (Tp, hsp)
    float* dO = scratch.Take(head);                 // (Tp, hsp)
    float* dOt = scratch.Take(head);                // (hsp, Tp)
    float* dQ = scratch.Take(head);                 // (Tp, hsp), Σ over key tiles of dS·K
    float* dK = scratch.Take(size_t(kTile) * hsp);  // (kTile, hsp) for the current key tile
    float* dV = scratch.Take(size_t(kTile) * hsp);
    float* Pt = scratch.Take(kTile * kTile);   // (kTile keys, kTile queries)
    float* dSt = scratch.Take(kTile * kTile);  // dP first, then dS in place
    float* L = scratch.Take(Tp);               // lse; +inf on padded rows so that their P = 0
    float* D = scratch.Take(Tp);

    for (int t = 0; t < ntiles; ++t) {
      const int n = std::min(kTile, T_ - t * kTile);
      LoadTile(Q + size_t(t) * kTile * hsp, q_base, t * kTile, n, C3, hs, hsp, scale);
      LoadTile(K + size_t(t) * kTile * hsp, q_base + C, t * kTile, n, C3, hs, hsp);
      LoadTile(V + size_t(t) * kTile * hsp, q_base + 2 * C, t * kTile, n, C3, hs, hsp);
      LoadTile(dO + size_t(t) * kTile * hsp, do_base, t * kTile, n, C, hs, hsp);
    }
    for (int i = 0; i < Tp; ++i)
      for (int d = 0; d < hsp; ++d) {
        Qt[size_t(d) * Tp + i] = Q[size_t(i) * hsp + d];
        dOt[size_t(d) * Tp + i] = dO[size_t(i) * hsp + d];
      }
    for (int i = 0; i < T_; ++i) {
      const T* o = o_base + size_t(i) * C;
      const float* g = dO + size_t(i) * hsp;
      float acc = 0.0f;
      for (int d = 0; d < hs; ++d) acc += g[d] * ToFloat(o[d]);
      D[i] = acc;
      L[i] = lse_bh[i];
    }
    std::fill(D + T_, D + Tp, 0.0f);
    std::fill(L + T_, L + Tp, std::numeric_limits<float>::infinity());
    std::memset(dQ, 0, sizeof(float) * head);

    for (int kt = 0; kt < ntiles; ++kt) {
      const int j0 = kt * kTile;
      const float* Kj = K + size_t(j0) * hsp;
      const float* Vj = V + size_t(j0) * hsp;
      std::memset(dK, 0, sizeof(float) * kTile * hsp);
      std::memset(dV, 0, sizeof(float) * kTile * hsp);
      for (int qt = kt; qt < ntiles; ++qt) {
        const int i0 = qt * kTile;
        Gemm(Pt, kTile, Kj, hsp, 1, Qt + i0, Tp, kTile, kTile, hsp, false);
        if (qt == kt) MaskDiagonal(Pt);
        Gemm(dSt, kTile, Vj, hsp, 1, dOt + i0, Tp, kTile, kTile, hsp, false);
        for (int j = 0; j < kTile; ++j)
          for (int r = 0; r < kTile; r += kLanes) {
            float* pp = Pt + j * kTile + r;
            float* ds = dSt + j * kTile + r;
            V16 p = Exp(Load(pp) - Load(L + i0 + r));
            Store(pp, p);
            Store(ds, p * (Load(ds) - Load(D + i0 + r)));
          }
        // dV[j] += Σ_r P[j][r]·dO[r];  dK[j] += Σ_r dS[j][r]·Q[r] (Q carries the 1/√hs);
        // dQ[r] += Σ_j dS[j][r]·K[j] (1/√hs applied once at the end).
        Gemm(dV, hsp, Pt, kTile, 1, dO + size_t(i0) * hsp, hsp, kTile, hsp, kTile, true);
        Gemm(dK, hsp, dSt, kTile, 1, Q + size_t(i0) * hsp, hsp, kTile, hsp, kTile, true);
        Gemm(dQ + size_t(i0) * hsp, hsp, dSt, 1, kTile, Kj, hsp, kTile, hsp, kTile, true);
      }
      const int nk = std::min(kTile, T_ - j0);
      for (int j = 0; j < nk; ++j) {
        T* dk = dq_base + size_t(j0 + j) * C3 + C;
        T* dv = dk + C;
        for (int d = 0; d < hs; ++d) {
          dk[d] = FromFloat<T>(dK[j * hsp + d]);
          dv[d] = FromFloat<T>(dV[j * hsp + d]);
        }
      }
    }
    for (int i = 0; i < T_; ++i) {
      T* dq = dq_base + size_t(i) * C3;
      for (int d = 0; d < hs; ++d) dq[d] = FromFloat<T>(dQ[size_t(i) * hsp + d] * scale);
    }
  }
}

template void AttentionForward<float>(float*, float*, const float*, int, int, int, int);
template void AttentionForward<bf16>(bf16*, float*, const bf16*, int, int, int, int);
template void AttentionBackward<float>(float*, const float*, const float*, const float*,
                                       const float*, int, int, int, int);
template void AttentionBackward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                      int, int, int, int);

}  // namespace keel::kernels

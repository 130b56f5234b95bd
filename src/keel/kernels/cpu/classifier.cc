// Classifier (x · wteᵀ) fused with softmax cross-entropy.
//
// Why tiles of rows rather than of the vocabulary: a vocabulary chunk cannot finish its softmax
// gradient before the row's log-sum-exp over all chunks is known, so it would have to compute the
// logits twice (+2·M·V·C FLOPs, ~10% of a GPT-2 124M step). A tile of kRowTile rows holds all of
// its rows. logits (kRowTile × Vp floats), turns them into gradients in place and
// feeds them to the two backward products; the full M×V logits never exist.
//
// Legend: M rows (B*T), C channels, V real vocabulary, Vp padded vocabulary.
#include "keel/kernels/cpu/classifier.h"

#include <algorithm>
#include <cmath>

#include "keel/kernels/cpu/matmul.h"
#include "keel/kernels/cpu/scratch.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"
#include "keel/kernels/cpu/vec_math.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

// 512 rows: the three products run 20% faster than at 128 rows (measured on GPT-2 shapes), and
// the tile stays bounded (512 × 50304 floats = 103 MB) whatever the batch.
constexpr int kRowTile = 512;

// max over row[0..V); -inf for none.
float RowMax(const float* row, int V) {
  // GCC 12 leaves `omp simd reduction(max)` over std::max scalar (vmaxss, one dependent chain):
  // that loop alone was 77% of the row's log-sum-exp. Four accumulators hide vmaxps' latency.
  float mx = -INFINITY;
  int v = 0;
#if defined(KEEL_ISA_AVX512)
  __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  for (; v + 64 <= V; v += 64) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(row + v));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(row + v + 16));
    m2 = _mm512_max_ps(m2, _mm512_loadu_ps(row + v + 32));
    m3 = _mm512_max_ps(m3, _mm512_loadu_ps(row + v + 48));
  }
  for (; v + 16 <= V; v += 16) m0 = _mm512_max_ps(m0, _mm512_loadu_ps(row + v));
  mx = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
#elif defined(KEEL_ISA_AVX2)
  __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  for (; v + 32 <= V; v += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(row + v));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(row + v + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(row + v + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(row + v + 24));
  }
  for (; v + 8 <= V; v += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(row + v));
  __m256 m = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  mx = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
#endif
  for (; v < V; ++v) mx = std::max(mx, row[v]);
  return mx;
}

// Σ exp(row[v] - mx) over v < V. With kStore, each exp(row[v] - mx) replaces row[v]: the gradient
// then scales them instead of computing every exponential a second time (the exponentials were
// half of the row pass, and the row is still in L2 when it is read back).
// `next` (or null): the row the caller takes next, prefetched into L2 a line per vector meanwhile.
// The logits tile outgrows the caches, so RowMax fetched each row from memory while the cores
// waited, as long as this pass took to compute (quickstart: 1.5% of the step each); fetched
// behind these exponentials instead, it arrives in L2.
template <bool kStore>
float RowExpSum(float* row, int V, float mx, const float* next) {
  float sum = 0;
  int v = 0;
  [[maybe_unused]] auto prefetch = [next](int at) {
    if (next) _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T1);
  };
#if defined(KEEL_ISA_AVX512)
  __m512 acc = _mm512_setzero_ps();
  const __m512 vmx = _mm512_set1_ps(mx);
  for (; v + 16 <= V; v += 16) {
    prefetch(v);
    const __m512 e = ExpApprox16(_mm512_sub_ps(_mm512_loadu_ps(row + v), vmx));
    if constexpr (kStore) _mm512_storeu_ps(row + v, e);
    acc = _mm512_add_ps(acc, e);
  }
  sum = _mm512_reduce_add_ps(acc);
#elif defined(KEEL_ISA_AVX2)
  __m256 acc = _mm256_setzero_ps();
  const __m256 vmx = _mm256_set1_ps(mx);
  for (; v + 8 <= V; v += 8) {
    if (v % 16 == 0) prefetch(v);
    const __m256 e = ExpApprox8(_mm256_sub_ps(_mm256_loadu_ps(row + v), vmx));
    if constexpr (kStore) _mm256_storeu_ps(row + v, e);
    acc = _mm256_add_ps(acc, e);
  }
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  sum = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
#endif
  for (; v < V; ++v) {
    const float e = ExpApprox(row[v] - mx);
    if constexpr (kStore) row[v] = e;
    sum += e;
  }
  return sum;
}

// g[v] = (softmax[v] - [v == target]) · dloss for v < V, 0 for the padding, from e[v] =
// exp(logit[v] - mx) (RowExpSum's stored row): softmax[v] = e[v] · exp(mx - lse). g may alias e.
// Each g[v] is rounded to R (to nearest even) and stored as T: T = R, or T = float for products
// that run in fp32 on widened operands, which then read the rounded values where they are.
template <typename T, typename R = T>
void RowGradient(T* g, const float* e, float mx, float lse, int target, float dloss, int V,
                 int Vp) {
  static_assert(std::is_same_v<T, R> || std::is_same_v<T, float>);
  constexpr bool kWide = std::is_same_v<T, float> && !std::is_same_v<R, float>;
  auto round = [](float x) -> T {
    if constexpr (kWide)
      return ToFloat(FromFloat<R>(x));
    else
      return FromFloat<T>(x);
  };
  const float k = ExpApprox(mx - lse);
  const float p_target = target >= 0 ? e[target] * k : 0.0f;
  const float kd = k * dloss;
  int v = 0;
#if defined(KEEL_ISA_AVX512)
  const __m512 vk = _mm512_set1_ps(kd);
  for (; v + 16 <= V; v += 16) {
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(e + v), vk);
    if constexpr (std::is_same_v<R, float>) {
      _mm512_storeu_ps(g + v, p);
    } else if constexpr (std::is_same_v<R, f16>) {
      const __m256i h = _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      if constexpr (kWide)
        _mm512_storeu_ps(g + v, _mm512_cvtph_ps(h));
      else
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(g + v), h);
    } else {
      // Round to nearest even, as ToBf16 does (softmax values are finite).
      __m512i u = _mm512_castps_si512(p);
      __m512i bias =
          _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                           _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)));
      u = _mm512_add_epi32(u, bias);
      if constexpr (kWide) {
        _mm512_storeu_ps(g + v, _mm512_castsi512_ps(
                                    _mm512_and_si512(u, _mm512_set1_epi32(int32_t(0xffff0000)))));
      } else {
        __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(g + v), h);
      }
    }
  }
#elif defined(KEEL_ISA_AVX2)
  const __m256 vk = _mm256_set1_ps(kd);
  for (; v + 8 <= V; v += 8) {
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(e + v), vk);
    if constexpr (std::is_same_v<R, float>) {
      _mm256_storeu_ps(g + v, p);
    } else if constexpr (std::is_same_v<R, f16>) {
      const __m128i h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      if constexpr (kWide)
        _mm256_storeu_ps(g + v, _mm256_cvtph_ps(h));
      else
        _mm_storeu_si128(reinterpret_cast<__m128i*>(g + v), h);
    } else {
      // Round to nearest even, as ToBf16 does (softmax values are finite).
      __m256i u = _mm256_castps_si256(p);
      __m256i bias =
          _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                           _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)));
      u = _mm256_add_epi32(u, bias);
      if constexpr (kWide) {
        _mm256_storeu_ps(g + v, _mm256_castsi256_ps(
                                    _mm256_and_si256(u, _mm256_set1_epi32(int32_t(0xffff0000)))));
      } else {
        __m256i w = _mm256_srli_epi32(u, 16);
        // The 16-bit results (< 2^16, so packus does not saturate) of both halves, in order.
        __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(g + v), h);
      }
    }
  }
#endif
  for (; v < V; ++v) g[v] = round(e[v] * kd);
  if (target >= 0) g[target] = round((p_target - 1.0f) * dloss);
  for (int v = V; v < Vp; ++v) g[v] = FromFloat<T>(0.0f);
}

// logits (rows, cols) fp32 = x (rows, C) · wte[0:cols]ᵀ. In fp32, oneDNN 2.6 runs this short-K
// product 13% faster as products over vocabulary chunks (512 × 256 × 50304 on an AVX-512 Xeon:
// 52 → 45.5 ms, the same 1-2% slower or faster at 4096-16384 columns); bf16's is left whole.
template <typename T>
void Logits(float* logits, const T* x, const T* wte, int rows, int C, int cols) {
  const int chunk = std::is_same_v<T, float> ? 16384 : cols;
  for (int v0 = 0; v0 < cols; v0 += chunk) {
    GemmArgs g;
    g.trans_b = true;
    g.M = rows, g.N = std::min(chunk, cols - v0), g.K = C;
    g.A = x, g.lda = C;
    g.B = wte + size_t(v0) * C, g.ldb = C;
    g.C = logits + v0, g.ldc = cols;
    g.ab_type = DTypeOf<T>();
    g.c_type = DType::kF32;
    Gemm(g);
  }
}

template <typename T>
void Run(float* losses, T* dx, float* dwte, const T* x, const T* wte, const int32_t* targets,
         float dloss, int M, int C, int V, int Vp, const VocabShard* shard) {
  // Reused across calls: one allocation for the life of the process.
  static AlignedScratch<float> logits_buf, stats_buf;
  static AlignedScratch<T> grad_buf;
  float* logits = logits_buf.Get(size_t(kRowTile) * Vp);
  float* lse = stats_buf.Get(size_t(3) * kRowTile);
  float* target_logit = lse + kRowTile;
  float* row_max = target_logit + kRowTile;
  // This shard's real ids: [v0, v0 + live) of the vocabulary, columns [0, live) of its logits.
  const int v0 = shard ? shard->v0 : 0;
  const int live = std::clamp(V - v0, 0, Vp);
  auto local = [&](int t) { return t >= v0 && t < v0 + live ? t - v0 : -1; };
  // Where 16-bit products run in fp32 (matmul.h), each product would widen its operands again:
  // the whole vocabulary's weights twice per row tile, the gradient tile twice. The weights are
  // widened once per call here instead, and the gradient is written in fp32 over the logits,
  // rounded to T as it is made, so that the products run in fp32 on the values a native product
  // would read (quickstart classifier on a Xeon whose AMX is hidden: 695 -> 631 ms, fp32 609;
  // GPT-2 124M 931 -> 818, fp32 826; rounding in place of a bf16 tile widened again: 608-678 ->
  // 568-650 ms).
  const bool widened = !std::is_same_v<T, float> && ProductsEmulated(DTypeOf<T>());
  static AlignedScratch<float> wide_wte_buf, wide_x_buf, wide_dx_buf;
  const float* wide_wte = nullptr;
  if (widened) {
    float* w = wide_wte_buf.Get(size_t(Vp) * C);
    WidenRows(DTypeOf<T>(), w, C, wte, C, Vp, C);
    wide_wte = w;
  }
  // fp32 gradients (and widened ones) are written over the logits; 16-bit ones need their own.
  T* grad = nullptr;
  if (dx && !widened) {
    if constexpr (std::is_same_v<T, float>)
      grad = logits;
    else
      grad = grad_buf.Get(size_t(kRowTile) * Vp);
  }
  for (int r0 = 0; r0 < M; r0 += kRowTile) {
    const int rows = std::min(kRowTile, M - r0);
    // Row r's loss and, with dx, its gradient, once lse and target_logit hold the whole
    // vocabulary's.
    auto Finish = [&](int r) {
      const bool scored = targets[r0 + r] >= 0;
      losses[r0 + r] = scored ? lse[r] - target_logit[r] : 0.0f;
      if (!dx) return;
      float* e = logits + size_t(r) * Vp;
      const int t = local(targets[r0 + r]);
      if (widened)
        RowGradient<float, T>(e, e, row_max[r], lse[r], t, scored ? dloss : 0.0f, live, Vp);
      else
        RowGradient(grad + size_t(r) * Vp, e, row_max[r], lse[r], t, scored ? dloss : 0.0f, live,
                    Vp);
    };
    float* wide_x = nullptr;
    if (widened) {
      wide_x = wide_x_buf.Get(size_t(kRowTile) * C);
      WidenRows(DTypeOf<T>(), wide_x, C, x + size_t(r0) * C, C, rows, C);
      Logits<float>(logits, wide_x, wide_wte, rows, C, Vp);
    } else {
      Logits(logits, x + size_t(r0) * C, wte, rows, C, Vp);
    }
    // One pass per row while it sits in L2 (200 KB for GPT-2's vocabulary), unless a vocabulary
    // shard must first combine its statistics with the other shards'.
    const bool fused = !(shard && shard->combine);
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r) {
      float* row = logits + size_t(r) * Vp;
      const int t = local(targets[r0 + r]);
      target_logit[r] = t >= 0 ? row[t] : 0.0f;
      row_max[r] = live > 0 ? RowMax(row, live) : -INFINITY;
      const float* next = r + 1 < rows ? row + Vp : nullptr;
      const float sum = live <= 0 ? 0.0f
                        : dx      ? RowExpSum<true>(row, live, row_max[r], next)
                                  : RowExpSum<false>(row, live, row_max[r], next);
      lse[r] = live > 0 ? row_max[r] + std::log(sum) : -INFINITY;
      if (fused) Finish(r);
    }
    if (!fused) {
      shard->combine(lse, target_logit, rows);
#pragma omp parallel for schedule(static)
      for (int r = 0; r < rows; ++r) Finish(r);
    }
    if (!dx) continue;
    // The products' operands: as stored, or widened (the gradient tile is the logits').
    const DType ab = widened ? DType::kF32 : DTypeOf<T>();
    const void* g_in = grad;
    const void* w_in = wte;
    const void* x_in = x + size_t(r0) * C;
    void* dx_out = dx + size_t(r0) * C;
    if (widened) {
      g_in = logits, w_in = wide_wte, x_in = wide_x;
      dx_out = wide_dx_buf.Get(size_t(kRowTile) * C);
    }
    const size_t es = DTypeSize(ab);
    // dx (rows,C) = g (rows,Vp) · wte (Vp,C). In fp32, oneDNN runs this long-K product 30% faster
    // as a sum over vocabulary chunks (measured: 177 → 236 GFLOP/s); bf16 would round the partial
    // sums, and its AMX product is fast as it is.
    const int chunk = ab == DType::kF32 ? 8192 : Vp;
    for (int v0 = 0; v0 < Vp; v0 += chunk) {
      GemmArgs a;
      a.M = rows, a.N = C, a.K = std::min(chunk, Vp - v0);
      a.A = static_cast<const char*>(g_in) + v0 * es, a.lda = Vp;
      a.B = static_cast<const char*>(w_in) + size_t(v0) * C * es, a.ldb = C;
      a.C = dx_out, a.ldc = C;
      a.ab_type = a.c_type = ab;
      a.beta = v0 == 0 ? 0.0f : 1.0f;
      Gemm(a);
    }
    if (widened)
      NarrowRows(DTypeOf<T>(), dx + size_t(r0) * C, C, static_cast<float*>(dx_out), C, rows, C);
    // dwte (Vp,C) += gᵀ (Vp,rows) · x (rows,C); none for a frozen classifier.
    if (!dwte) continue;
    GemmArgs b;
    b.trans_a = true;
    b.M = Vp, b.N = C, b.K = rows;
    b.A = g_in, b.lda = Vp;
    b.B = x_in, b.ldb = C;
    b.C = dwte, b.ldc = C;
    b.ab_type = ab;
    b.c_type = DType::kF32;
    b.beta = 1.0f;
    Gemm(b);
  }
}

}  // namespace

template <typename T>
void ClassifierForward(float* losses, const T* x, const T* wte, const int32_t* targets, int M,
                       int C, int V, int Vp, const VocabShard* shard) {
  Run<T>(losses, nullptr, nullptr, x, wte, targets, 0.0f, M, C, V, Vp, shard);
}

template <typename T>
void ClassifierForwardBackward(float* losses, T* dx, float* dwte, const T* x, const T* wte,
                               const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                               const VocabShard* shard) {
  Run<T>(losses, dx, dwte, x, wte, targets, dloss, M, C, V, Vp, shard);
}

template <typename T>
void ClassifierLogits(float* logits, const T* x, const T* wte, int M, int C, int V) {
  Logits(logits, x, wte, M, C, V);
}

#define KEEL_INSTANTIATE(T)                                                                     \
  template void ClassifierForward<T>(float*, const T*, const T*, const int32_t*, int, int, int, \
                                     int, const VocabShard*);                                   \
  template void ClassifierForwardBackward<T>(float*, T*, float*, const T*, const T*,            \
                                             const int32_t*, float, int, int, int, int,         \
                                             const VocabShard*);                                \
  template void ClassifierLogits<T>(float*, const T*, const T*, int, int, int);
KEEL_INSTANTIATE(float)
KEEL_INSTANTIATE(bf16)
KEEL_INSTANTIATE(f16)
#undef KEEL_INSTANTIATE

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

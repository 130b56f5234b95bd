// Causal multi-head self-attention on the CPU, flash-style (see attention.h for the contract).
//
// Legend: B batch, T time, C channels, NH heads, hs = C/NH head size, hsp = hs rounded up to a
// multiple of the vector width (scratch rows are zero-padded so every inner loop runs on whole
// vectors). Tiles: kTile = 64 query rows (r, i0 + r) × 64 key rows (j, j0 + j). S scores, P
// probabilities, O output accumulator, D_i = Σ_d dout_i·out_i, m running max, l running sum.
// A trailing `t` marks a transposed scratch layout: St[j][r], Qt[d][r], Ot[d][r]. Holding the
// query index innermost lets the softmax statistics (one per query row) be plain vector ops.
//
// Parallelism and determinism: the forward splits (b, h, query tile) items across threads, and
// each item's arithmetic never depends on which thread runs it. The backward gives each (b, key/
// value head) to one thread, which accumulates dq over key tiles and dk, dv over the group's query
// heads and their query tiles in a fixed order.
// Results are therefore bitwise identical for any thread count.
#include "keel/kernels/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

#include "keel/kernels/cpu/scratch.h"

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"
// Kept below isa_begin.h (not sorted above it): it compiles for this copy's ISA.
#include "keel/kernels/cpu/attention_tiles.h"

// GCC 12 reports the pass-through operand of AVX-512 intrinsics (_mm512_undefined_ps, a
// self-initialized variable by design) as maybe uninitialized once the exp is inlined into the
// OpenMP regions below; nothing here reads it. Only where that happens: the AVX-512 copy, GCC.
#if defined(KEEL_ISA_AVX512) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

using namespace internal;

// Per-thread scratch that only grows: Take() carves consecutive 64-byte-aligned pieces, Reserve()
// starts over.
class Scratch {
 public:
  void Reserve(size_t floats) {
    data_ = buffer_.Get(RoundUp(floats));
    used_ = 0;
  }
  float* Take(size_t floats) {
    float* p = data_ + used_;
    used_ += RoundUp(floats);
    return p;
  }
  // Whole cache lines, whatever the vector width.
  static size_t RoundUp(size_t floats) { return (floats + 15) / 16 * 16; }

 private:
  AlignedScratch<float> buffer_;
  float* data_ = nullptr;
  size_t used_ = 0;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

int RoundUpTo(int x, int m) { return (x + m - 1) / m * m; }

// Consecutive time steps of one head are 3C (or C) elements apart, a page or more at GPT-2 sizes,
// so the hardware prefetchers, which stop at page boundaries, never run ahead of the row loops
// that gather and scatter them; those loops prefetch kAhead rows early by hand instead.
constexpr int kAhead = 8;

template <int kForWrite, typename T>
inline void PrefetchRow(const T* p, int n) {
  const char* bytes = reinterpret_cast<const char*>(p);
  for (size_t i = 0; i < size_t(n) * sizeof(T); i += 64)
    __builtin_prefetch(bytes + i, kForWrite, 3);
}

// dst[0, hsp) = scale·src[0, hs) in fp32, then zeros.
template <typename T>
inline void LoadRow(float* dst, const T* src, int hs, int hsp, float scale = 1.0f) {
  for (int d = 0; d < hs; ++d) dst[d] = ToFloat(src[d]) * scale;
  for (int d = hs; d < hsp; ++d) dst[d] = 0.0f;
}

// dst[0, hs) = scale·src[0, hs), rounded to T.
template <typename T>
inline void StoreRow(T* dst, const float* src, int hs, float scale = 1.0f) {
  for (int d = 0; d < hs; ++d) dst[d] = FromFloat<T>(src[d] * scale);
}

// One head's k and v at time steps [0, n) and q at [q_lo, n) (none if q_base is null), q
// pre-scaled by `scale`, into row-major (·, hsp) fp32 arrays indexed by time step; rows [n, n
// rounded up to kTile) are zero. Each base points at its head's channel 0 of time step 0; rows are
// `stride` elements apart.
template <typename T>
void GatherHead(float* Q, float* K, float* V, const T* q_base, const T* k_base, const T* v_base,
                size_t stride, int q_lo, int n, int hs, int hsp, float scale) {
  for (int i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const size_t ahead = size_t(i + kAhead) * stride;
      if (q_base && i + kAhead >= q_lo) PrefetchRow<0>(q_base + ahead, hs);
      PrefetchRow<0>(k_base + ahead, hs);
      PrefetchRow<0>(v_base + ahead, hs);
    }
    const size_t at = size_t(i) * stride;
    if (q_base && i >= q_lo) LoadRow(Q + size_t(i) * hsp, q_base + at, hs, hsp, scale);
    LoadRow(K + size_t(i) * hsp, k_base + at, hs, hsp);
    LoadRow(V + size_t(i) * hsp, v_base + at, hs, hsp);
  }
  const size_t pad = size_t(RoundUpTo(n, kTile) - n) * hsp;
  if (q_base) std::memset(Q + size_t(std::max(n, q_lo)) * hsp, 0, sizeof(float) * pad);
  std::memset(K + size_t(n) * hsp, 0, sizeof(float) * pad);
  std::memset(V + size_t(n) * hsp, 0, sizeof(float) * pad);
}

// Scores above the diagonal of a diagonal tile (key j after query r) never count: -inf there
// (or 0, for a tile whose products skipped those entries and whose values must stay finite).
inline void FillAboveDiagonal(float* St, float value = -std::numeric_limits<float>::infinity()) {
  for (int j = 1; j < kTile; ++j)
    for (int r = 0; r < j; ++r) St[j * kTile + r] = value;
}

// Document masking: keys of tile j0 before query row i0 + r's document start never count (rows
// r < nq; padded rows past T are left alone, their probabilities are zeroed otherwise).
inline void MaskBeforeDocument(float* St, const int32_t* doc_start, int i0, int nq, int j0) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < nq; ++r) {
    const int first = std::min(doc_start[i0 + r] - j0, kTile);
    for (int j = 0; j < first; ++j) St[j * kTile + r] = kNegInf;
  }
}

// Under document masking a key tile can hide every key from some query rows, leaving their
// running max at -inf; the exponentials then subtract 0 instead (giving 0, not NaN).
inline Vec FiniteOrZero(Vec m) {
  const Vec neg_inf = Splat(-std::numeric_limits<float>::infinity());
  return m == neg_inf ? Splat(0.0f) : m;
}

// Key windows past the causal mask (attention.h): query row i sees keys from doc_start[i] (or 0)
// up to key_end[i] (exclusive; or i + 1). Each is this batch row's, or null.
struct Window {
  const int32_t* doc_start = nullptr;
  const int32_t* key_end = nullptr;
  bool any() const { return doc_start || key_end; }
  // The first key any of a query tile's rows [i0, i0 + nq) sees, and one past the last.
  int First(int i0, int nq) const {
    if (!doc_start) return 0;
    int first = doc_start[i0];
    for (int r = 1; r < nq; ++r) first = std::min(first, int(doc_start[i0 + r]));
    return first;
  }
  int End(int i0, int nq) const {
    if (!key_end) return i0 + nq;
    int end = key_end[i0];
    for (int r = 1; r < nq; ++r) end = std::max(end, int(key_end[i0 + r]));
    return std::min(end, i0 + nq);
  }
  // -inf (scores; the probabilities that follow are then 0) where rows r < nq of the query tile
  // at i0 do not see keys of the key tile at j0.
  void Mask(float* St, int i0, int nq, int j0) const {
    if (doc_start) MaskBeforeDocument(St, doc_start, i0, nq, j0);
    if (!key_end) return;
    const float kNegInf = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < nq; ++r)
      for (int j = std::max(0, key_end[i0 + r] - j0); j < kTile; ++j) St[j * kTile + r] = kNegInf;
  }
  Window Row(int b, int T_) const {
    return {doc_start ? doc_start + size_t(b) * T_ : nullptr,
            key_end ? key_end + size_t(b) * T_ : nullptr};
  }
};

}  // namespace

namespace {

// Forward for one query tile of one head, given that head's Q (pre-scaled), K and V in fp32
// scratch up to the end of this tile. Writes out and lse for rows [i0, i0 + nq).
// win: this batch row's key windows.
template <typename T>
void ForwardQueryTile(T* out, float* lse, const float* Q, const float* K, const float* V, int qt,
                      int T_, int C, int hsp, int hs, float* work, const Window& win) {
  const int i0 = qt * kTile, nq = std::min(kTile, T_ - i0);
  float* Qt = work;                     // (hsp, kTile)
  float* O = Qt + size_t(hsp) * kTile;  // (kTile, hsp)
  float* St = O + size_t(hsp) * kTile;  // (kTile keys, kTile queries)
  float* m = St + kTileArea;
  float* l = m + kTile;

  Transpose(Qt, kTile, Q + size_t(i0) * hsp, hsp, kTile, hsp);
  std::memset(O, 0, sizeof(float) * size_t(hsp) * kTile);
  std::fill(m, m + kTile, -std::numeric_limits<float>::infinity());
  std::fill(l, l + kTile, 0.0f);

  // Key tiles wholly outside every row's window hold nothing any of its rows sees.
  const int kt_lo = win.First(i0, nq) / kTile, kt_hi = (win.End(i0, nq) - 1) / kTile;
  for (int kt = kt_lo; kt <= kt_hi; ++kt) {
    const float* Kj = K + size_t(kt) * kTile * hsp;
    const float* Vj = V + size_t(kt) * kTile * hsp;
    const bool diag = kt == qt;
    Gemm(St, kTile, Kj, hsp, 1, Qt, kTile, kTile, kTile, hsp, false,
         diag ? Tri::kColsFromRow : Tri::kFull);
    // Padded keys of the last tile sit above the diagonal of it, so the mask covers them too.
    if (diag) FillAboveDiagonal(St);
    win.Mask(St, i0, nq, kt * kTile);
    // Online softmax, a vector of query rows at a time.
    for (int r = 0; r < kTile; r += kLanes) {
      // Four running maxima: one chain of 64 dependent max operations was ~15% of the forward's
      // own time at T = 1024 (the max is exact, so the grouping changes no output; with a NaN
      // score m may differ, but the exponentials carry the NaN to out and lse either way).
      static_assert(kTile % 4 == 0);
      const Vec m_old = Load(m + r);
      Vec mj[4] = {m_old, m_old, m_old, m_old};
      for (ptrdiff_t j = 0; j < kTile; j += 4)
        for (int k = 0; k < 4; ++k) mj[k] = Max(mj[k], Load(St + (j + k) * kTile + r));
      const Vec m_new = Max(Max(mj[0], mj[1]), Max(mj[2], mj[3]));
      const Vec m_sub = win.any() ? FiniteOrZero(m_new) : m_new;
      Vec sum{};
      for (ptrdiff_t j = 0; j < kTile; ++j) {
        Vec p = Exp(Load(St + j * kTile + r) - m_sub);
        Store(St + j * kTile + r, p);
        sum += p;
      }
      Vec alpha = Exp(m_old - m_sub);  // 0 on the first tile, where m_old = -inf
      Store(l + r, Fma(Load(l + r), alpha, sum));
      Store(m + r, m_new);
      if (kt > kt_lo)
        for (int i = 0; i < kLanes; ++i) {
          const Vec a = Splat(alpha[i]);
          float* o = O + size_t(r + i) * hsp;
          for (ptrdiff_t d = 0; d < hsp; d += kLanes) Store(o + d, Load(o + d) * a);
        }
    }
    // O[r][d] += Σ_j P[j][r]·V[j][d]. Rows of O are query rows, so that the output leaves them
    // as they are (a transposed O read back one float at a time stalled the stores that followed).
    Gemm(O, hsp, St, 1, kTile, Vj, hsp, kTile, hsp, kTile, true, diag ? Tri::kKToRow : Tri::kFull);
  }

  for (int r = 0; r < nq; ++r) {
    if (r + kAhead < nq) PrefetchRow<1>(out + size_t(i0 + r + kAhead) * C, hs);
    StoreRow(out + size_t(i0 + r) * C, O + size_t(r) * hsp, hs, 1.0f / l[r]);
    lse[i0 + r] = m[r] + std::log(l[r]);
  }
}

}  // namespace

template <typename T>
void AttentionForward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, int NKV,
                      const int32_t* doc_start, const int32_t* key_end) {
  const Window win{doc_start, key_end};
  const int hs = C / NH, hsp = RoundUpTo(hs, kLanes), KV = NKV > 0 ? NKV : NH;
  const size_t stride = size_t(C) + 2 * size_t(KV) * hs;
  const int ntiles = (T_ + kTile - 1) / kTile;
  const float scale = 1.0f / std::sqrt(float(hs));
  // Whole heads per item when there are enough heads to keep every thread busy, so that a head's
  // q, k and v are gathered once; otherwise one query tile per item. Either way each row's
  // arithmetic is the same, so the choice only moves time.
  const bool per_head = B * NH >= 4 * omp_get_max_threads();
  const int nitems = per_head ? B * NH : B * NH * ntiles;
  // In per-tile mode items run from the last query tile (most key tiles) to the first, so that
  // dynamic scheduling ends with the small ones.
#pragma omp parallel for schedule(dynamic, 1)
  for (int item = 0; item < nitems; ++item) {
    const int bh = item % (B * NH), b = bh / NH, h = bh % NH;
    const int qt_hi = per_head ? ntiles - 1 : ntiles - 1 - item / (B * NH);
    const int qt_lo = per_head ? 0 : qt_hi;
    const int nrows = std::min(T_, (qt_hi + 1) * kTile);
    const size_t rows = size_t(qt_hi + 1) * kTile * hsp;
    const size_t work = 2 * size_t(hsp) * kTile + kTileArea + 2 * size_t(kTile);

    Scratch& scratch = ThreadScratch();
    scratch.Reserve(3 * Scratch::RoundUp(rows) + work);
    float* Q = scratch.Take(rows);  // (·, hsp) by time step, pre-scaled; rows < qt_lo·kTile unused
    float* K = scratch.Take(rows);
    float* V = scratch.Take(rows);
    const T* base = qkv + size_t(b) * T_ * stride;
    const T* k_base = base + C + size_t(h / (NH / KV)) * hs;
    GatherHead(Q, K, V, base + size_t(h) * hs, k_base, k_base + size_t(KV) * hs, stride,
               qt_lo * kTile, nrows, hs, hsp, scale);
    float* w = scratch.Take(work);
    for (int qt = qt_hi; qt >= qt_lo; --qt)
      ForwardQueryTile(out + size_t(b) * T_ * C + size_t(h) * hs, lse + size_t(bh) * T_, Q, K, V,
                       qt, T_, C, hsp, hs, w, win.Row(b, T_));
  }
}

// Grouped-query attention: one thread takes a key/value head and the query heads that read it, one
// after another, so that the key/value gradients sum over the group in a fixed order.
template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                       int T_, int C, int NH, int NKV, const int32_t* doc_start,
                       const int32_t* key_end) {
  const int hs = C / NH, hsp = RoundUpTo(hs, kLanes), KV = NKV > 0 ? NKV : NH, G = NH / KV;
  const size_t stride = size_t(C) + 2 * size_t(KV) * hs;
  const int ntiles = (T_ + kTile - 1) / kTile, Tp = ntiles * kTile;
  const float scale = 1.0f / std::sqrt(float(hs));
  const size_t head = size_t(Tp) * hsp;
#pragma omp parallel for schedule(dynamic, 1)
  for (int bkv = 0; bkv < B * KV; ++bkv) {
    const int b = bkv / KV, kvh = bkv % KV;
    const T* base = qkv + size_t(b) * T_ * stride;
    const T* k_base = base + C + size_t(kvh) * hs;
    const T* v_base = k_base + size_t(KV) * hs;
    const Window win = Window{doc_start, key_end}.Row(b, T_);
    T* dbase = dqkv + size_t(b) * T_ * stride;
    T* dk_base = dbase + C + size_t(kvh) * hs;
    T* dv_base = dk_base + size_t(KV) * hs;

    Scratch& scratch = ThreadScratch();
    scratch.Reserve(9 * Scratch::RoundUp(head) + 2 * kTileArea + 2 * size_t(Tp) + hsp);
    // Whole-head copies in fp32, converted once: every query tile meets every earlier key tile.
    float* Q = scratch.Take(head);         // (Tp, hsp), pre-scaled by 1/√hs
    float* Qt = scratch.Take(head);        // (Tp/kTile, hsp, kTile), pre-scaled
    float* K = scratch.Take(head);         // (Tp, hsp)
    float* V = scratch.Take(head);         // (Tp, hsp)
    float* dO = scratch.Take(head);        // (Tp, hsp)
    float* dOt = scratch.Take(head);       // (Tp/kTile, hsp, kTile)
    float* dQ = scratch.Take(head);        // (Tp, hsp), Σ over key tiles of dS·K
    float* dK = scratch.Take(head);        // (Tp, hsp), Σ over the group's query tiles of dS·Q
    float* dV = scratch.Take(head);        // (Tp, hsp), Σ over the group's query tiles of P·dO
    float* Pt = scratch.Take(kTileArea);   // (kTile keys, kTile queries)
    float* dSt = scratch.Take(kTileArea);  // dP first, then dS in place
    float* L = scratch.Take(Tp);           // lse; +inf on padded rows so that their P = 0
    float* D = scratch.Take(Tp);
    float* row = scratch.Take(hsp);

    GatherHead<T>(nullptr, K, V, nullptr, k_base, v_base, stride, 0, T_, hs, hsp, scale);
    std::memset(dK, 0, sizeof(float) * head);
    std::memset(dV, 0, sizeof(float) * head);
    for (int h = kvh * G; h < (kvh + 1) * G; ++h) {
      const T* q_base = base + size_t(h) * hs;
      const T* do_base = dout + size_t(b) * T_ * C + size_t(h) * hs;
      const T* o_base = out + size_t(b) * T_ * C + size_t(h) * hs;
      const float* lse_bh = lse + (size_t(b) * NH + h) * T_;
      for (int i = 0; i < T_; ++i) {
        if (i + kAhead < T_) {
          PrefetchRow<0>(q_base + size_t(i + kAhead) * stride, hs);
          PrefetchRow<0>(do_base + size_t(i + kAhead) * C, hs);
          PrefetchRow<0>(o_base + size_t(i + kAhead) * C, hs);
        }
        LoadRow(Q + size_t(i) * hsp, q_base + size_t(i) * stride, hs, hsp, scale);
        float* g = dO + size_t(i) * hsp;
        LoadRow(g, do_base + size_t(i) * C, hs, hsp);
        LoadRow(row, o_base + size_t(i) * C, hs, hsp);
        Vec acc{};
        for (int d = 0; d < hsp; d += kLanes) acc = Fma(Load(g + d), Load(row + d), acc);
        float sum = 0.0f;
        for (int k = 0; k < kLanes; ++k) sum += acc[k];
        D[i] = sum;
        L[i] = lse_bh[i];
      }
      std::memset(Q + size_t(T_) * hsp, 0, sizeof(float) * size_t(Tp - T_) * hsp);
      std::memset(dO + size_t(T_) * hsp, 0, sizeof(float) * size_t(Tp - T_) * hsp);
      std::fill(D + T_, D + Tp, 0.0f);
      std::fill(L + T_, L + Tp, std::numeric_limits<float>::infinity());
      // The transposed copies are tile-major (each query tile's hsp × kTile block contiguous):
      // with a row stride of Tp floats, often a power of two, a tile's rows would share a few L1
      // sets and evict each other inside the matrix product.
      for (int i0 = 0; i0 < Tp; i0 += kTile) {
        Transpose(Qt + size_t(i0) * hsp, kTile, Q + size_t(i0) * hsp, hsp, kTile, hsp);
        Transpose(dOt + size_t(i0) * hsp, kTile, dO + size_t(i0) * hsp, hsp, kTile, hsp);
      }
      std::memset(dQ, 0, sizeof(float) * head);

      for (int kt = 0; kt < ntiles; ++kt) {
        const size_t j0 = size_t(kt) * kTile * hsp;
        for (int qt = kt; qt < ntiles; ++qt) {
          const int i0 = qt * kTile;
          // Every row of the query tile sees nothing of this key tile: nothing to add.
          const int nq = std::min(kTile, T_ - i0);
          if (win.any() && (win.First(i0, nq) >= (kt + 1) * kTile || win.End(i0, nq) <= kt * kTile))
            continue;
          const bool diag = qt == kt;
          const Tri rows_keys = diag ? Tri::kColsFromRow : Tri::kFull;
          Gemm(Pt, kTile, K + j0, hsp, 1, Qt + size_t(i0) * hsp, kTile, kTile, kTile, hsp, false,
               rows_keys);
          if (diag) FillAboveDiagonal(Pt);
          win.Mask(Pt, i0, nq, kt * kTile);
          Gemm(dSt, kTile, V + j0, hsp, 1, dOt + size_t(i0) * hsp, kTile, kTile, kTile, hsp, false,
               rows_keys);
          if (diag) FillAboveDiagonal(dSt, 0.0f);  // P is 0 there; 0·dP must not be 0·NaN
          for (ptrdiff_t j = 0; j < kTile; ++j)
            for (int r = 0; r < kTile; r += kLanes) {
              float* pp = Pt + j * kTile + r;
              float* ds = dSt + j * kTile + r;
              Vec p = Exp(Load(pp) - Load(L + i0 + r));
              Store(pp, p);
              Store(ds, p * (Load(ds) - Load(D + i0 + r)));
            }
          // dV[j] += Σ_r P[j][r]·dO[r];  dK[j] += Σ_r dS[j][r]·Q[r] (Q carries the 1/√hs);
          // dQ[r] += Σ_j dS[j][r]·K[j] (1/√hs applied once at the end).
          const Tri from = diag ? Tri::kKFromRow : Tri::kFull,
                    to = diag ? Tri::kKToRow : Tri::kFull;
          Gemm(dV + j0, hsp, Pt, kTile, 1, dO + size_t(i0) * hsp, hsp, kTile, hsp, kTile, true,
               from);
          Gemm(dK + j0, hsp, dSt, kTile, 1, Q + size_t(i0) * hsp, hsp, kTile, hsp, kTile, true,
               from);
          Gemm(dQ + size_t(i0) * hsp, hsp, dSt, 1, kTile, K + j0, hsp, kTile, hsp, kTile, true, to);
        }
      }
      T* dq_base = dbase + size_t(h) * hs;
      for (int i = 0; i < T_; ++i) {
        if (i + kAhead < T_) PrefetchRow<1>(dq_base + size_t(i + kAhead) * stride, hs);
        StoreRow(dq_base + size_t(i) * stride, dQ + size_t(i) * hsp, hs, scale);
      }
    }
    for (int i = 0; i < T_; ++i) {
      if (i + kAhead < T_) {
        PrefetchRow<1>(dk_base + size_t(i + kAhead) * stride, hs);
        PrefetchRow<1>(dv_base + size_t(i + kAhead) * stride, hs);
      }
      StoreRow(dk_base + size_t(i) * stride, dK + size_t(i) * hsp, hs);
      StoreRow(dv_base + size_t(i) * stride, dV + size_t(i) * hsp, hs);
    }
  }
}

#define KEEL_ATTENTION_INSTANTIATE(T)                                                              \
  template void AttentionForward<T>(T*, float*, const T*, int, int, int, int, int, const int32_t*, \
                                    const int32_t*);                                               \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, const float*, int, int,     \
                                     int, int, int, const int32_t*, const int32_t*);
KEEL_ATTENTION_INSTANTIATE(float)
KEEL_ATTENTION_INSTANTIATE(bf16)
KEEL_ATTENTION_INSTANTIATE(f16)
#undef KEEL_ATTENTION_INSTANTIATE

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

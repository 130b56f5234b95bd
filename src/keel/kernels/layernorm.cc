// LayerNorm forward/backward over the last axis; the contract (+= rules, saved stats) is in
// layernorm.h.
//
// Legend: N rows (B*T), C channels.
//
// All arithmetic is fp32 whatever T is; T only sets how tensors are stored. Rows are independent,
// so both passes parallelize over rows; the row's reductions use `omp simd reduction`, whose order
// is fixed at compile time (by the vector width), so every row is bitwise repeatable.
//
// dweight/dbias are sums over rows, which threads must not race on. Rows are cut into blocks whose
// count depends on N only — never on the thread count — each block sums into its own fp32
// partial, and the partials are then added in block order. The result is therefore bitwise the
// same on every call and for any number of threads, at the cost of one small extra pass.
#include "keel/kernels/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace keel::kernels {
namespace {

constexpr float kEps = 1e-5f;

// More row blocks allow more threads but lengthen the final reduction (blocks·2·C floats). 32
// blocks keep 16 cores busy; at least 8 rows per block keep the partials under ~1/8 of the main
// pass's traffic.
constexpr int kMaxRowBlocks = 32;
constexpr int kMinRowsPerBlock = 8;

int RowBlocks(int N) {
  return std::clamp((N + kMinRowsPerBlock - 1) / kMinRowsPerBlock, 1, kMaxRowBlocks);
}

// Scratch owned by the calling thread, grown on demand and kept, so that steady-state training
// allocates nothing. thread_local (not a plain static) keeps two concurrent callers apart.
float* PartialScratch(size_t n) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace

template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                      const T* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* x = inp + size_t(i) * C;
    T* y = out + size_t(i) * C;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; ++c) sum += ToFloat(x[c]);
    const float m = sum / float(C);
    // Two passes (mean, then squared deviations) rather than E[x²] - E[x]²: no cancellation when
    // |mean| >> std, and the second read hits L1.
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int c = 0; c < C; ++c) {
      const float d = ToFloat(x[c]) - m;
      sum_sq += d * d;
    }
    const float s = 1.0f / std::sqrt(sum_sq / float(C) + kEps);
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float norm = (ToFloat(x[c]) - m) * s;
      y[c] = FromFloat<T>(norm * ToFloat(weight[c]) + ToFloat(bias[c]));
    }
    mean[i] = m;
    rstd[i] = s;
  }
}

template <typename T>
void LayerNormBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                       const T* weight, const float* mean, const float* rstd, int N, int C) {
  const int blocks = RowBlocks(N);
  // Layout: block k owns [k·2C, k·2C + C) for dweight and the next C floats for dbias.
  float* partial = PartialScratch(size_t(blocks) * 2 * C);
#pragma omp parallel for schedule(static)
  for (int k = 0; k < blocks; ++k) {
    float* pw = partial + size_t(k) * 2 * C;
    float* pb = pw + C;
    std::fill(pw, pw + 2 * size_t(C), 0.0f);
    const int row_begin = int(int64_t(N) * k / blocks);
    const int row_end = int(int64_t(N) * (k + 1) / blocks);
    for (int i = row_begin; i < row_end; ++i) {
      const T* x = inp + size_t(i) * C;
      const T* dy = dout + size_t(i) * C;
      T* dx = dinp + size_t(i) * C;
      const float m = mean[i];
      const float s = rstd[i];
      // With n = (x - mean)·rstd and dn = weight·dout:
      //   dx = rstd · (dn - mean(dn) - n · mean(dn · n)).
      // Recomputing n from x is cheaper than saving it (one fp32 tensor of B*T*C per layer).
      float sum_dn = 0.0f, sum_dn_n = 0.0f;
#pragma omp simd reduction(+ : sum_dn, sum_dn_n)
      for (int c = 0; c < C; ++c) {
        const float n = (ToFloat(x[c]) - m) * s;
        const float dn = ToFloat(weight[c]) * ToFloat(dy[c]);
        sum_dn += dn;
        sum_dn_n += dn * n;
      }
      const float mean_dn = sum_dn / float(C);
      const float mean_dn_n = sum_dn_n / float(C);
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float n = (ToFloat(x[c]) - m) * s;
        const float g = ToFloat(dy[c]);
        const float dn = ToFloat(weight[c]) * g;
        pw[c] += n * g;
        pb[c] += g;
        dx[c] = FromFloat<T>(ToFloat(dx[c]) + s * (dn - mean_dn - n * mean_dn_n));
      }
    }
  }
  // Ordered reduction over blocks, folded into block 0's partial so that the channel loops stay
  // plain vectorizable streams. Channels are independent, so threads split them; every loop below
  // has the same 2C iterations (dweight's C, then dbias's C) and the same static schedule, so each
  // thread owns the same floats throughout (OpenMP guarantees that assignment) and `nowait` is
  // safe.
  float* total = partial;
#pragma omp parallel
  {
    for (int k = 1; k < blocks; ++k) {
      const float* pk = partial + size_t(k) * 2 * C;
#pragma omp for simd schedule(static) nowait
      for (int c = 0; c < 2 * C; ++c) total[c] += pk[c];
    }
#pragma omp for simd schedule(static)
    for (int c = 0; c < 2 * C; ++c) (c < C ? dweight[c] : dbias[c - C]) += total[c];
  }
}

template void LayerNormForward<float>(float*, float*, float*, const float*, const float*,
                                      const float*, int, int);
template void LayerNormForward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*,
                                     int, int);
template void LayerNormBackward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, int, int);
template void LayerNormBackward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*,
                                      const float*, const float*, int, int);

}  // namespace keel::kernels

// LayerNorm forward/backward over the last axis; the contract (+= rules, saved stats) is in
// layernorm.h.
//
// Legend: N rows (B*T), C channels.
//
// All arithmetic is fp32 whatever T is; T only sets how tensors are stored. Rows are independent,
// so both passes parallelize over rows; the row's reductions use `omp simd reduction`, whose order
// is fixed at compile time (by the vector width), so every row is bitwise repeatable.
//
// dweight/dbias are sums over rows, which threads must not race on: row_blocks.h sums them in an
// order that depends on N only, so they are bitwise the same for any number of threads.
#include "keel/kernels/cpu/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"
#include "keel/kernels/cpu/row_blocks.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

constexpr float kEps = 1e-5f;
using internal::AddPartials;
using internal::PartialScratch;
using internal::RowBlocks;

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
  AddPartials(partial, blocks, 2 * C,
              [&](int c) -> float& { return c < C ? dweight[c] : dbias[c - C]; });
}

template void LayerNormForward<float>(float*, float*, float*, const float*, const float*,
                                      const float*, int, int);
template void LayerNormForward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*,
                                     int, int);
template void LayerNormForward<f16>(f16*, float*, float*, const f16*, const f16*, const f16*, int,
                                    int);
template void LayerNormBackward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, int, int);
template void LayerNormBackward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*,
                                      const float*, const float*, int, int);
template void LayerNormBackward<f16>(f16*, float*, float*, const f16*, const f16*, const f16*,
                                     const float*, const float*, int, int);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

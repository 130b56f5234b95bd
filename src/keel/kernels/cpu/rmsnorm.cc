// RMSNorm forward/backward; the contract is in rmsnorm.h.
//
// Legend: N rows (B*T), C channels.
//
// As LayerNorm (layernorm.cc): fp32 arithmetic, rows in parallel, each row's reductions in an
// order fixed at compile time, and dweight summed over rows in an order that depends on N only
// (row_blocks.h), so results are bitwise the same for any thread count.
#include "keel/kernels/cpu/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"
#include "keel/kernels/cpu/row_blocks.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void RmsNormForward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < N; ++i) {
    const T* x = inp + size_t(i) * C;
    T* y = out + size_t(i) * C;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int c = 0; c < C; ++c) sum_sq += ToFloat(x[c]) * ToFloat(x[c]);
    const float s = 1.0f / std::sqrt(sum_sq / float(C) + eps);
#pragma omp simd
    for (int c = 0; c < C; ++c) y[c] = FromFloat<T>(ToFloat(x[c]) * s * ToFloat(weight[c]));
    rstd[i] = s;
  }
}

template <typename T>
void RmsNormBackward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                     const float* rstd, int N, int C) {
  const int blocks = internal::RowBlocks(N);
  float* partial = internal::PartialScratch(size_t(blocks) * C);
#pragma omp parallel for schedule(static)
  for (int k = 0; k < blocks; ++k) {
    float* pw = partial + size_t(k) * C;
    std::fill(pw, pw + C, 0.0f);
    const int row_begin = int(int64_t(N) * k / blocks);
    const int row_end = int(int64_t(N) * (k + 1) / blocks);
    for (int i = row_begin; i < row_end; ++i) {
      const T* x = inp + size_t(i) * C;
      const T* dy = dout + size_t(i) * C;
      T* dx = dinp + size_t(i) * C;
      const float s = rstd[i];
      // With n = x·rstd and dn = weight·dout: dx = rstd · (dn - n · mean(dn · n)).
      float sum_dn_n = 0.0f;
#pragma omp simd reduction(+ : sum_dn_n)
      for (int c = 0; c < C; ++c) sum_dn_n += ToFloat(weight[c]) * ToFloat(dy[c]) * ToFloat(x[c]);
      const float mean_dn_n = sum_dn_n * s / float(C);
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float n = ToFloat(x[c]) * s;
        const float g = ToFloat(dy[c]);
        pw[c] += n * g;
        dx[c] = FromFloat<T>(ToFloat(dx[c]) + s * (ToFloat(weight[c]) * g - n * mean_dn_n));
      }
    }
  }
  internal::AddPartials(partial, blocks, C, [&](int c) -> float& { return dweight[c]; });
}

template void RmsNormForward<float>(float*, float*, const float*, const float*, int, int, float);
template void RmsNormForward<bf16>(bf16*, float*, const bf16*, const bf16*, int, int, float);
template void RmsNormForward<f16>(f16*, float*, const f16*, const f16*, int, int, float);
template void RmsNormBackward<float>(float*, float*, const float*, const float*, const float*,
                                     const float*, int, int);
template void RmsNormBackward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*,
                                    const float*, int, int);
template void RmsNormBackward<f16>(f16*, float*, const f16*, const f16*, const f16*, const float*,
                                   int, int);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

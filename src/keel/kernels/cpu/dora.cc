// DoRA (contracts: dora.h). The norm is a row of W + s·B·A at a time (r axpys, then Σ v² in fp64),
// each row on one thread: the same value whatever the thread count. The magnitude's gradient sums
// each column in row order, a block of columns per thread, for the same reason.
#include "keel/kernels/cpu/dora.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "keel/kernels/op_args.h"

// This copy's ISA from here on (isa_begin.h).
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void DoraNorm(float* scale, float* inv_norm, const float* magnitude, const T* W, const T* A,
              const T* B, int out, int in, int r, float s) {
#pragma omp parallel
  {
    std::vector<float> v(static_cast<size_t>(in));
#pragma omp for schedule(static)
    for (int o = 0; o < out; ++o) {
      const T* w = W + size_t(o) * size_t(in);
#pragma omp simd
      for (int i = 0; i < in; ++i) v[size_t(i)] = ToFloat(w[i]);
      for (int j = 0; j < r; ++j) {
        const float b = s * ToFloat(B[size_t(o) * size_t(r) + size_t(j)]);
        const T* a = A + size_t(j) * size_t(in);
#pragma omp simd
        for (int i = 0; i < in; ++i) v[size_t(i)] += b * ToFloat(a[i]);
      }
      double sq = 0;
#pragma omp simd reduction(+ : sq)
      for (int i = 0; i < in; ++i) sq += double(v[size_t(i)]) * v[size_t(i)];
      if (!magnitude) {  // a partial sum of squares (Backend::DoraNorm)
        inv_norm[o] = float(sq);
        continue;
      }
      const float n = float(std::sqrt(sq));
      inv_norm[o] = DoraInverseNorm(n);
      scale[o] = magnitude[o] * inv_norm[o];
    }
  }
}

template <typename T>
void DoraScale(T* out, const T* z, const float* scale, const float* bias, int rows, int cols,
               bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const T* zr = z + size_t(r) * size_t(cols);
    T* o = out + size_t(r) * size_t(cols);
#pragma omp simd
    for (int c = 0; c < cols; ++c) {
      float v = ToFloat(zr[c]) * scale[c];
      if (bias) v += bias[c];
      if (accumulate) v += ToFloat(o[c]);
      o[c] = FromFloat<T>(v);
    }
  }
}

template <typename T>
void DoraMagnitudeGrad(float* dmag, const T* dy, const T* z, const float* inv_norm, int rows,
                       int cols) {
  constexpr int kBlock = 64;  // 4 AVX-512 vectors of fp32 sums: enough blocks for every thread
  const int blocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < blocks; ++b) {
    const int c0 = b * kBlock, n = std::min(kBlock, cols - c0);
    float acc[kBlock] = {};
    for (int r = 0; r < rows; ++r) {
      const T* g = dy + size_t(r) * size_t(cols) + size_t(c0);
      const T* x = z + size_t(r) * size_t(cols) + size_t(c0);
#pragma omp simd
      for (int c = 0; c < n; ++c) acc[c] += ToFloat(g[c]) * ToFloat(x[c]);
    }
    for (int c = 0; c < n; ++c) dmag[c0 + c] += acc[c] * inv_norm[c0 + c];
  }
}

template void DoraNorm<float>(float*, float*, const float*, const float*, const float*,
                              const float*, int, int, int, float);
template void DoraNorm<bf16>(float*, float*, const float*, const bf16*, const bf16*, const bf16*,
                             int, int, int, float);
template void DoraNorm<f16>(float*, float*, const float*, const f16*, const f16*, const f16*, int,
                            int, int, float);
template void DoraScale<float>(float*, const float*, const float*, const float*, int, int, bool);
template void DoraScale<bf16>(bf16*, const bf16*, const float*, const float*, int, int, bool);
template void DoraScale<f16>(f16*, const f16*, const float*, const float*, int, int, bool);
template void DoraMagnitudeGrad<float>(float*, const float*, const float*, const float*, int, int);
template void DoraMagnitudeGrad<bf16>(float*, const bf16*, const bf16*, const float*, int, int);
template void DoraMagnitudeGrad<f16>(float*, const f16*, const f16*, const float*, int, int);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

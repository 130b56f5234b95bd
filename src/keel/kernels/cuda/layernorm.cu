// LayerNorm (contract: cpu/layernorm.h), and the row kernels RMSNorm shares (rmsnorm.cu): one warp
// per row, fp32 statistics. The weight gradients are column sums over the rows, taken in a fixed
// order (row blocks into partials, then the partials in block order): the same bits on every run,
// unlike atomics.
#include <type_traits>

#include "keel/kernels/cuda/layernorm.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <typename T>
__global__ void LnForward(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b,
                          int N, int C, bool rms, float eps) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t at = size_t(row) * C;
  float mu = 0.0f;
  if (!rms) {
    for (int c = lane; c < C; c += 32) mu += Ld(inp, at + c);
    mu = WarpSum(mu) / C;
  }
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = Ld(inp, at + c) - mu;
    var += d * d;
  }
  var = WarpSum(var) / C;
  const float rs = rsqrtf(var + eps);
  for (int c = lane; c < C; c += 32) {
    const float y = (Ld(inp, at + c) - mu) * rs * Ld(w, c) + (b ? Ld(b, c) : 0.0f);
    St(out, at + c, y);
  }
  if (lane == 0) {
    if (mean) mean[row] = mu;
    rstd[row] = rs;
  }
}

// dinp += rstd·(dnorm − mean(dnorm) − x̂·mean(dnorm·x̂)), dnorm = dout·w (RMSNorm: no mean term).
template <typename T>
__global__ void LnBackwardRows(T* dinp, const T* dout, const T* inp, const T* w, const float* mean,
                               const float* rstd, int N, int C) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= N) return;
  const size_t at = size_t(row) * C;
  const float mu = mean ? mean[row] : 0.0f, rs = rstd[row];
  float sum_dn = 0.0f, sum_dnx = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float dn = Ld(dout, at + c) * Ld(w, c);
    sum_dn += dn;
    sum_dnx += dn * (Ld(inp, at + c) - mu) * rs;
  }
  sum_dn = mean ? WarpSum(sum_dn) / C : 0.0f;
  sum_dnx = WarpSum(sum_dnx) / C;
  for (int c = lane; c < C; c += 32) {
    const float dn = Ld(dout, at + c) * Ld(w, c);
    const float xh = (Ld(inp, at + c) - mu) * rs;
    St(dinp, at + c, Ld(dinp, at + c) + rs * (dn - sum_dn - xh * sum_dnx));
  }
}

// partial[k][c] (and partial[kRowBlocks + k][c]): Σ over row block k of dout·x̂ (and of dout).
template <typename T>
__global__ void LnWeightPartials(float* partial, const T* dout, const T* inp, const float* mean,
                                 const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
  if (c >= C) return;
  const int per = (N + kRowBlocks - 1) / kRowBlocks;
  float dw = 0.0f, db = 0.0f;
  for (int r = k * per; r < min(N, (k + 1) * per); ++r) {
    const float d = Ld(dout, size_t(r) * C + c);
    dw += d * (Ld(inp, size_t(r) * C + c) - (mean ? mean[r] : 0.0f)) * rstd[r];
    db += d;
  }
  partial[size_t(k) * C + c] = dw;
  partial[size_t(kRowBlocks + k) * C + c] = db;
}

__global__ void AddPartials(float* dw, float* db, const float* partial, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float w = 0.0f, b = 0.0f;
  for (int k = 0; k < kRowBlocks; ++k) {
    w += partial[size_t(k) * C + c];
    b += partial[size_t(kRowBlocks + k) * C + c];
  }
  dw[c] += w;
  if (db) db[c] += b;
}

}  // namespace

void Norm(DType t, void* out, float* mean, float* rstd, const void* inp, const void* w,
          const void* b, int N, int C, bool rms, float eps, cudaStream_t stream) {
  Typed(t, [&](auto* z) {
    using U = std::remove_pointer_t<decltype(z)>;
    LnForward<U><<<Blocks(size_t(N), kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
        static_cast<U*>(out), mean, rstd, static_cast<const U*>(inp), static_cast<const U*>(w),
        static_cast<const U*>(b), N, C, rms, eps);
  });
  KEEL_CUDA(cudaGetLastError());
}

void NormBackward(DType t, void* dinp, float* dw, float* db, const void* dout, const void* inp,
                  const void* w, const float* mean, const float* rstd, int N, int C,
                  cudaStream_t stream) {
  float* partial =
      static_cast<float*>(Scratch(6, sizeof(float) * 2 * kRowBlocks * size_t(C), stream));
  Typed(t, [&](auto* z) {
    using U = std::remove_pointer_t<decltype(z)>;
    const U* d = static_cast<const U*>(dout);
    const U* x = static_cast<const U*>(inp);
    LnWeightPartials<U><<<dim3(Blocks(size_t(C), 256), kRowBlocks), 256, 0, stream>>>(
        partial, d, x, mean, rstd, N, C);
    AddPartials<<<Blocks(size_t(C), 256), 256, 0, stream>>>(dw, db, partial, C);
    LnBackwardRows<U><<<Blocks(size_t(N), kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
        static_cast<U*>(dinp), d, x, static_cast<const U*>(w), mean, rstd, N, C);
  });
  KEEL_CUDA(cudaGetLastError());
}

void LayerNormForward(DType t, void* out, float* mean, float* rstd, const void* inp, const void* w,
                      const void* b, int N, int C, cudaStream_t stream) {
  Norm(t, out, mean, rstd, inp, w, b, N, C, /*rms=*/false, 1e-5f, stream);
}

void LayerNormBackward(DType t, void* dinp, float* dw, float* db, const void* dout, const void* inp,
                       const void* w, const float* mean, const float* rstd, int N, int C,
                       cudaStream_t stream) {
  NormBackward(t, dinp, dw, db, dout, inp, w, mean, rstd, N, C, stream);
}

}  // namespace keel::kernels::cuda

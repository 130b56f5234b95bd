// DoRA on the GPU (contracts: Backend::DoraNorm, DoraScale, DoraMagnitudeGrad). The norm: a block
// per row of W, its threads over the row's columns (each recomputes its element of s·B·A from r
// products), a fixed-order block sum. The magnitude's gradient: a block per 32 columns (coalesced
// loads across a warp), its 8 warps each summing every 8th row, then the 8 partial sums added in
// warp order: a fixed order, whatever the launch.
#include "keel/kernels/cuda/dora.cuh"
#include "keel/kernels/op_args.h"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void Norm(float* scale, float* inv_norm, const float* magnitude, const T* W, const T* A,
                     const T* B, int in, int r, float s) {
  const int o = blockIdx.x;
  float sq = 0;
  for (int i = threadIdx.x; i < in; i += blockDim.x) {
    float v = Ld(W, size_t(o) * in + i);
    for (int j = 0; j < r; ++j) v += s * Ld(B, size_t(o) * r + j) * Ld(A, size_t(j) * in + i);
    sq += v * v;
  }
  __shared__ float part[kThreads / 32];
  sq = WarpSum(sq);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = sq;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (unsigned w = 0; w < kThreads / 32; ++w) total += part[w];
    if (!magnitude) {  // a partial sum of squares (Backend::DoraNorm)
      inv_norm[o] = total;
      return;
    }
    const float n = sqrtf(total);
    inv_norm[o] = DoraInverseNorm(n);
    scale[o] = magnitude[o] * inv_norm[o];
  }
}

template <typename T>
__global__ void Scale(T* out, const T* z, const float* scale, const float* bias, int cols, size_t n,
                      bool accumulate) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int c = int(i % size_t(cols));
  float v = Ld(z, i) * scale[c];
  if (bias) v += bias[c];
  if (accumulate) v += Ld(out, i);
  St(out, i, v);
}

constexpr unsigned kGradCols = 32, kGradWarps = 8;

template <typename T>
__global__ void MagnitudeGrad(float* dmag, const T* dy, const T* z, const float* inv_norm, int rows,
                              int cols) {
  const int c = blockIdx.x * kGradCols + threadIdx.x;
  float acc = 0;
  if (c < cols)
    for (int r = threadIdx.y; r < rows; r += kGradWarps)
      acc += Ld(dy, size_t(r) * cols + c) * Ld(z, size_t(r) * cols + c);
  __shared__ float part[kGradWarps][kGradCols];
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  float sum = 0;
  for (unsigned w = 0; w < kGradWarps; ++w) sum += part[w][threadIdx.x];
  dmag[c] += sum * inv_norm[c];
}

}  // namespace

void DoraNorm(DType t, float* scale, float* inv_norm, const float* magnitude, const void* W,
              const void* A, const void* B, int out, int in, int r, float s, cudaStream_t stream) {
  if (out == 0) return;
  Typed(t, [&](auto* z) {
    using U = std::remove_pointer_t<decltype(z)>;
    Norm<U><<<unsigned(out), kThreads, 0, stream>>>(
        scale, inv_norm, magnitude, static_cast<const U*>(W), static_cast<const U*>(A),
        static_cast<const U*>(B), in, r, s);
  });
  KEEL_CUDA(cudaGetLastError());
}

void DoraScale(DType t, void* out, const void* z, const float* scale, const float* bias, int rows,
               int cols, bool accumulate, cudaStream_t stream) {
  const size_t n = size_t(rows) * size_t(cols);
  KEEL_TYPED_LAUNCH(
      t, n, kThreads,
      (Scale<U><<<blocks, kThreads, 0, stream>>>(static_cast<U*>(out), static_cast<const U*>(z),
                                                 scale, bias, cols, n, accumulate)));
}

void DoraMagnitudeGrad(DType t, float* dmag, const void* dy, const void* z, const float* inv_norm,
                       int rows, int cols, cudaStream_t stream) {
  const dim3 threads(kGradCols, kGradWarps);
  KEEL_TYPED_LAUNCH(
      t, size_t(cols), kGradCols,
      (MagnitudeGrad<U><<<blocks, threads, 0, stream>>>(
          dmag, static_cast<const U*>(dy), static_cast<const U*>(z), inv_norm, rows, cols)));
}

}  // namespace keel::kernels::cuda

// AdamW (contract: cpu/adamw.h), and the other elementwise work of the update: the gradient
// norm's Σ x² (a fixed-order reduction), the rounding of fp32 into bf16, and dst += src.
#include <cmath>

#include "keel/kernels/cuda/adamw.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void AdamWKernel(float* master, bf16d* working, float* m, float* v, const float* g,
                            size_t n, AdamWParams p, float bc1, float bc2) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i] * p.grad_scale;
  const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * gi;
  const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float w = master[i];
  const float updated = w - p.lr * ((mi / bc1) / (sqrtf(vi / bc2) + p.eps) + p.weight_decay * w);
  master[i] = updated;
  if (working) working[i] = __float2bfloat16_rn(updated);
}

constexpr unsigned kSumBlocks = 1024;

// Each block's Σ x² in fp64 over a fixed stride pattern; partials then summed in block order.
__global__ void SquarePartials(double* partial, const float* x, size_t n) {
  __shared__ double sh[kThreads];
  double s = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    s += double(x[i]) * x[i];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (unsigned o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

__global__ void SumPartials(double* out, const double* partial, unsigned n) {
  double s = 0;
  for (unsigned k = 0; k < n; ++k) s += partial[k];
  *out = s;
}

__global__ void ToBf16Kernel(bf16d* out, const float* in, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void AddToKernel(float* dst, const float* src, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

}  // namespace

void AdamW(float* master, bf16* working, float* m, float* v, const float* g, size_t n,
           const AdamWParams& p, cudaStream_t stream) {
  if (n == 0) return;
  const float bc1 = float(1.0 - std::pow(double(p.beta1), p.step));
  const float bc2 = float(1.0 - std::pow(double(p.beta2), p.step));
  AdamWKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(
      master, reinterpret_cast<bf16d*>(working), m, v, g, n, p, bc1, bc2);
  KEEL_CUDA(cudaGetLastError());
}

double SumSquares(const float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return 0.0;
  double* partial = static_cast<double*>(Scratch(4, sizeof(double) * (kSumBlocks + 1), stream));
  SquarePartials<<<kSumBlocks, kThreads, 0, stream>>>(partial, x, n);
  SumPartials<<<1, 1, 0, stream>>>(partial + kSumBlocks, partial, kSumBlocks);
  KEEL_CUDA(cudaGetLastError());
  double out = 0;
  KEEL_CUDA(
      cudaMemcpyAsync(&out, partial + kSumBlocks, sizeof out, cudaMemcpyDeviceToHost, stream));
  KEEL_CUDA(cudaStreamSynchronize(stream));
  return out;
}

void ToBf16(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ToBf16Kernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(reinterpret_cast<bf16d*>(out), in, n);
  KEEL_CUDA(cudaGetLastError());
}

void AddTo(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  AddToKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
  KEEL_CUDA(cudaGetLastError());
}

}  // namespace keel::kernels::cuda

// AdamW (contract: cpu/adamw.h), and the other elementwise work of the update: the gradient
// norm's Σ x² (a fixed-order reduction), the rounding of fp32 into bf16 and back, and dst += src.
#include <cmath>
#include <type_traits>

#include "keel/core/error.h"
#include "keel/kernels/cuda/adamw.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

// Stochastic rounding (core/dtype.h's StochasticRoundBf16): a uniform 16-bit draw added below
// the cut, then truncated; inf and NaN as round-to-nearest.
__device__ inline bf16d RoundStochastic(float f, uint32_t r) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) >= 0x7f800000u) return __float2bfloat16_rn(f);
  return __ushort_as_bfloat16(static_cast<unsigned short>((u + (r & 0xffffu)) >> 16));
}

__device__ inline float Load(const float* p, size_t i) { return p[i]; }
__device__ inline float Load(const bf16d* p, size_t i) { return __bfloat162float(p[i]); }

// M: the moments' type; kMaster: an fp32 master exists (else the bf16 weights are the only copy).
template <typename M, bool kMaster>
__global__ void AdamWKernel(float* master, bf16d* working, M* m, M* v, const float* g, size_t n,
                            AdamWParams p, float bc1, float bc2) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  constexpr bool kBf16Moments = std::is_same_v<M, bf16d>;
  RoundDraws r{};
  if (kBf16Moments || !kMaster) r = RoundDrawsOf(p.round_key, p.index0 + i);
  const float gi = g[i] * p.grad_scale;
  const float mi = p.beta1 * Load(m, i) + (1.0f - p.beta1) * gi;
  const float vi = p.beta2 * Load(v, i) + (1.0f - p.beta2) * gi * gi;
  if constexpr (kBf16Moments) {
    m[i] = RoundStochastic(mi, r.m);
    v[i] = RoundStochastic(vi, r.v);
  } else {
    m[i] = mi;
    v[i] = vi;
  }
  const float w = kMaster ? master[i] : __bfloat162float(working[i]);
  const float updated = w - p.lr * ((mi / bc1) / (sqrtf(vi / bc2) + p.eps) + p.weight_decay * w);
  if constexpr (kMaster) {
    master[i] = updated;
    if (working) working[i] = __float2bfloat16_rn(updated);
  } else {
    working[i] = RoundStochastic(updated, r.w);
  }
}

// The kernel for `s`'s moment type M and whether it has a master.
template <typename M>
void LaunchAdamW(const AdamWState& s, size_t n, const AdamWParams& p, float bc1, float bc2,
                 cudaStream_t stream) {
  auto* w = reinterpret_cast<bf16d*>(s.working);
  auto* m = static_cast<M*>(s.m);
  auto* v = static_cast<M*>(s.v);
  const auto* g = static_cast<const float*>(s.grad);
  const unsigned blocks = Blocks(n, kThreads);
  if (s.master)
    AdamWKernel<M, true><<<blocks, kThreads, 0, stream>>>(s.master, w, m, v, g, n, p, bc1, bc2);
  else
    AdamWKernel<M, false><<<blocks, kThreads, 0, stream>>>(s.master, w, m, v, g, n, p, bc1, bc2);
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

__global__ void ToF32Kernel(float* out, const bf16d* in, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);
}

__global__ void AddToKernel(float* dst, const float* src, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

}  // namespace

void AdamW(const AdamWState& s, size_t n, const AdamWParams& p, cudaStream_t stream) {
  if (n == 0) return;
  KEEL_CHECK(s.master || s.working, "AdamW: neither master nor working weights");
  KEEL_CHECK(!s.bf16_grads, "AdamW: bf16 gradients are the CPU's (optim.grad_dtype)");
  const float bc1 = float(1.0 - std::pow(double(p.beta1), p.step));
  const float bc2 = float(1.0 - std::pow(double(p.beta2), p.step));
  if (s.bf16_moments)
    LaunchAdamW<bf16d>(s, n, p, bc1, bc2, stream);
  else
    LaunchAdamW<float>(s, n, p, bc1, bc2, stream);
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

void ToF32(float* out, const bf16* in, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ToF32Kernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(out, reinterpret_cast<const bf16d*>(in),
                                                            n);
  KEEL_CUDA(cudaGetLastError());
}

void AddTo(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  AddToKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
  KEEL_CUDA(cudaGetLastError());
}

}  // namespace keel::kernels::cuda

// fp8 on the GPU. Emulation (contracts: Backend::AbsMax, Backend::Fp8Round): the CPU's rounding
// (cpu/fp8.cc) one thread per element, and the largest magnitude as per-block partials (scratch
// slot 9) that the host finishes, NaN kept apart because fmaxf drops it. Native products
// (Backend::MatmulFp8*): bf16 operands quantized by CUDA's own conversion (round to nearest even,
// __NV_SATFINITE: the emulation's numbers) into fp8 bytes, row-major or transposed, in scratch
// slots 10-13, their dequantization scales in slot 14, then cuBLASLt (matmul.cu, GemmFp8). The
// transposes are a plain strided write, not yet a tiled one.
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <vector>

#include "keel/kernels/cuda/adamw.cuh"
#include "keel/kernels/cuda/fp8.cuh"
#include "keel/kernels/cuda/matmul.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kMaxBlocks = 256;

__device__ __forceinline__ float Round(float x, int mbits, int emin, float max) {
  const float a = fabsf(x);
  const int shift = 23 - mbits;
  unsigned u = __float_as_uint(a);
  u += (1u << (shift - 1)) - 1 + ((u >> shift) & 1);
  u &= ~((1u << shift) - 1);
  const float normal = __uint_as_float(u);
  const float c = __uint_as_float(unsigned(emin - mbits + 23 + 127) << 23);
  const float sub = __fsub_rn(__fadd_rn(a, c), c);
  const float small = __uint_as_float(unsigned(emin + 127) << 23);
  float r = a < small ? sub : normal;
  r = r > max ? max : r;
  r = copysignf(r, x);
  return x != x ? x : r;
}

template <typename T>
__global__ void RoundKernel(T* out, const T* in, size_t n, float scale, float inv, int mbits,
                            int emin, float max) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) St(out, i, __fmul_rn(Round(__fmul_rn(Ld(in, i), scale), mbits, emin, max), inv));
}

template <typename T>
__global__ void AbsMaxPartials(float* partial, const T* x, size_t n) {
  float m = 0;
  bool nan = false;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float v = fabsf(Ld(x, i));
    nan |= v != v;
    m = fmaxf(m, v);
  }
  __shared__ float warp_max[kThreads / 32];
  __shared__ int any_nan;
  if (threadIdx.x == 0) any_nan = 0;
  __syncthreads();
  if (nan) any_nan = 1;
  m = WarpMax(m);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    partial[blockIdx.x] = any_nan ? __int_as_float(0x7fc00000) : m;
  }
}

// out = fp8(in·scale) (rows×cols), or its transpose (cols×rows).
__global__ void QuantizeKernel(uint8_t* out, const bf16d* in, int rows, int cols, float scale,
                               bool e5m2, bool transpose) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(rows) * cols) return;
  const size_t r = i / size_t(cols), c = i % size_t(cols);
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(__fmul_rn(__bfloat162float(in[i]), scale),
                                                     __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
  out[transpose ? c * size_t(rows) + r : i] = q;
}

// rows×cols of `in` as fp8 bytes in scratch `slot`.
uint8_t* Quantize(int slot, const bf16* in, int rows, int cols, float scale, bool e5m2,
                  bool transpose, cudaStream_t stream) {
  const size_t n = size_t(rows) * cols;
  auto* out = static_cast<uint8_t*>(Scratch(slot, n, stream));
  if (n)
    QuantizeKernel<<<Blocks(n, kThreads), kThreads, 0, stream>>>(
        out, reinterpret_cast<const bf16d*>(in), rows, cols, scale, e5m2, transpose);
  KEEL_CUDA(cudaGetLastError());
  return out;
}

// The dequantization scales 1/s of `scales` in device memory (slot 14): the products read them
// when they run, in stream order after this copy.
const float* Descales(std::initializer_list<float> scales, cudaStream_t stream) {
  float host[4] = {};
  int i = 0;
  for (float s : scales) host[i++] = 1.0f / s;
  auto* d = static_cast<float*>(Scratch(14, sizeof host, stream));
  KEEL_CUDA(cudaMemcpyAsync(d, host, sizeof host, cudaMemcpyHostToDevice, stream));
  // The host array is gone on return: wait until it has been read.
  KEEL_CUDA(cudaStreamSynchronize(stream));
  return d;
}

}  // namespace

void MatmulFp8Forward(bf16* out, const bf16* x, const bf16* w, const float* bias, int M, int K,
                      int N, float sx, float sw, bool accumulate, cudaStream_t stream) {
  const uint8_t* xq = Quantize(10, x, M, K, sx, false, false, stream);
  const uint8_t* wq = Quantize(11, w, N, K, sw, false, false, stream);
  const float* d = Descales({sx, sw}, stream);
  GemmFp8(M, N, K, xq, false, wq, false, d, d + 1, out, false, accumulate ? 1.0f : 0.0f, stream);
  if (bias) AddBias(DType::kBF16, out, bias, M, N, stream);
}

void MatmulFp8Backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* x, const bf16* w,
                       int M, int K, int N, float sdy, float sx, float sw, cudaStream_t stream) {
  const float* d = Descales({sdy, sx, sw}, stream);
  if (dinp) {
    // dinp (M,K) = dout (M,N)·wᵀᵀ: w's transpose (K,N) puts the sum's N innermost.
    const uint8_t* dq = Quantize(10, dout, M, N, sdy, true, false, stream);
    const uint8_t* wt = Quantize(11, w, N, K, sw, false, true, stream);
    GemmFp8(M, K, N, dq, true, wt, false, d, d + 2, dinp, false, 0.0f, stream);
  }
  if (dweight) {
    // dweight (N,K) += doutᵀ (N,M)·xᵀᵀ: both transposed, M innermost. A weight's gradient may
    // start at any element of the flat layout; fp8 outputs must be 16-byte aligned, so an
    // unaligned one is summed into scratch (slot 15) and added.
    const uint8_t* dt = Quantize(12, dout, M, N, sdy, true, true, stream);
    const uint8_t* xt = Quantize(13, x, M, K, sx, false, true, stream);
    if (reinterpret_cast<uintptr_t>(dweight) % 16 == 0) {
      GemmFp8(N, K, M, dt, true, xt, false, d, d + 1, dweight, true, 1.0f, stream);
    } else {
      const size_t n = size_t(N) * K;
      auto* part = static_cast<float*>(Scratch(15, sizeof(float) * n, stream));
      GemmFp8(N, K, M, dt, true, xt, false, d, d + 1, part, true, 0.0f, stream);
      AddTo(dweight, part, n, stream);
    }
  }
}

float AbsMax(DType t, const void* x, size_t n, cudaStream_t stream) {
  if (n == 0) return 0;
  const unsigned blocks = std::min<unsigned>(kMaxBlocks, Blocks(n, kThreads));
  float* partial = static_cast<float*>(Scratch(9, sizeof(float) * blocks, stream));
  Typed(t, [&](auto* z) {
    using U = std::remove_pointer_t<decltype(z)>;
    AbsMaxPartials<U><<<blocks, kThreads, 0, stream>>>(partial, static_cast<const U*>(x), n);
  });
  KEEL_CUDA(cudaGetLastError());
  std::vector<float> host(blocks);
  KEEL_CUDA(cudaMemcpyAsync(host.data(), partial, sizeof(float) * blocks, cudaMemcpyDeviceToHost,
                            stream));
  KEEL_CUDA(cudaStreamSynchronize(stream));
  float m = 0;
  for (float v : host) {
    if (std::isnan(v)) return v;
    m = std::max(m, v);
  }
  return m;
}

void Fp8Round(DType t, void* out, const void* in, size_t n, float scale, Fp8Format f,
              cudaStream_t stream) {
  const bool e4m3 = f == Fp8Format::kE4M3;
  const int mbits = e4m3 ? 3 : 2, emin = e4m3 ? -6 : -14;
  const float max = Fp8Max(f), inv = 1.0f / scale;
  KEEL_TYPED_LAUNCH(
      t, n, kThreads,
      (RoundKernel<U><<<blocks, kThreads, 0, stream>>>(
          static_cast<U*>(out), static_cast<const U*>(in), n, scale, inv, mbits, emin, max)));
}

}  // namespace keel::kernels::cuda

// fp8 emulation (contracts: Backend::AbsMax, Backend::Fp8Round): the CPU's rounding (cpu/fp8.cc)
// one thread per element, and the largest magnitude as per-block partials (scratch slot 9) that
// the host finishes, NaN kept apart because fmaxf drops it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "keel/kernels/cuda/fp8.cuh"

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

}  // namespace

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

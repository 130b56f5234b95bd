// Shared by the CUDA backend's kernel files: error checks, bf16/fp32 loads and stores, warp
// reductions, launch sizes, the dtype dispatch and the device scratch. Internal to kernels/cuda/.
// Each operation's launchers are declared in the header of its own file, named as in cpu/
// (matmul.cuh, layernorm.cuh, ...); backend_cuda.cu dispatches to them. A launcher takes the stream
// it runs on as its last argument (the backend's compute stream) and issues all its work there.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "keel/core/dtype.h"

namespace keel::kernels::cuda {

// Throws keel::Error naming the call and CUDA's message.
void Check(cudaError_t e, const char* what);
void Check(cublasStatus_t s, const char* what);
#define KEEL_CUDA(call) ::keel::kernels::cuda::Check((call), #call)

using bf16d = __nv_bfloat16;

__device__ __forceinline__ float Ld(const float* p, size_t i) { return p[i]; }
__device__ __forceinline__ float Ld(const bf16d* p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void St(float* p, size_t i, float x) { p[i] = x; }
__device__ __forceinline__ void St(bf16d* p, size_t i, float x) { p[i] = __float2bfloat16_rn(x); }

// Max and sum over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

inline unsigned Blocks(size_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

// Row blocks of the fixed-order column sums (LayerNorm's and RMSNorm's weight gradients, bias
// gradients): each block sums its rows into a partial, then the partials are added in block order.
constexpr int kRowBlocks = 64;

// Calls f with a null pointer of the device type of `t` (float or __nv_bfloat16).
template <typename F>
void Typed(DType t, F&& f) {
  if (t == DType::kF32)
    f(static_cast<float*>(nullptr));
  else
    f(static_cast<bf16d*>(nullptr));
}

// Runs `body`, a launch of kernel<U> over `blocks` blocks, for the element type U of `t`, with the
// blocks of `threads` that cover n elements; nothing when n is 0.
#define KEEL_TYPED_LAUNCH(t, n, threads, body)    \
  Typed(t, [&](auto* z) {                         \
    using U = std::remove_pointer_t<decltype(z)>; \
    const unsigned blocks = Blocks(n, threads);   \
    if (blocks) body;                             \
  });                                             \
  KEEL_CUDA(cudaGetLastError())

// Device scratch that grows on demand and is kept (one per process: the backend is used from one
// thread, the trainer's), reallocated in the order of `stream`, the caller's. Slots: 0 cuBLASLt's
// workspace, 1-3 and 8 the classifier's logits, statistics, fp32 dx and bf16 gradient tile, 4 Σ
// x²'s partials, 5 attention's row dots, 6 the norms' weight-gradient partials, 7 the bias
// gradients' partials, 9 the fp8 amax partials, 10-13 fp8 operands, 14 their dequantization
// scales, 15 an fp8 weight gradient that cannot be written in place.
void* Scratch(int slot, size_t bytes, cudaStream_t stream);

}  // namespace keel::kernels::cuda

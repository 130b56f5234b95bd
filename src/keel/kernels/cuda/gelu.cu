// GELU, tanh approximation (contract: cpu/gelu.h): one thread per element.
#include <type_traits>

#include "keel/kernels/cuda/gelu.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void Gelu(T* out, const T* inp, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = Ld(inp, i), u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  St(out, i, x * Sigmoid(2.0f * u));
}

template <typename T>
__global__ void GeluBack(T* dinp, const T* inp, const T* dout, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = Ld(inp, i), u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float s = Sigmoid(2.0f * u);
  const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
  St(dinp, i, Ld(dout, i) * (s + 2.0f * x * s * (1.0f - s) * du));
}

}  // namespace

void GeluForward(DType t, void* out, const void* inp, size_t n, cudaStream_t stream) {
  KEEL_TYPED_LAUNCH(t, n, kThreads,
                    (Gelu<U><<<blocks, kThreads, 0, stream>>>(static_cast<U*>(out),
                                                              static_cast<const U*>(inp), n)));
}

void GeluBackward(DType t, void* dinp, const void* inp, const void* dout, size_t n,
                  cudaStream_t stream) {
  KEEL_TYPED_LAUNCH(
      t, n, kThreads,
      (GeluBack<U><<<blocks, kThreads, 0, stream>>>(
          static_cast<U*>(dinp), static_cast<const U*>(inp), static_cast<const U*>(dout), n)));
}

}  // namespace keel::kernels::cuda

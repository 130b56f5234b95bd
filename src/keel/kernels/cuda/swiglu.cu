// SwiGLU (contract: cpu/swiglu.h): one thread per output element.
#include <type_traits>

#include "keel/kernels/cuda/swiglu.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void Swiglu(T* out, const T* gu, int N, int F) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(N) * F) return;
  const size_t r = i / F, c = i % F;
  const float g = Ld(gu, r * 2 * F + c), u = Ld(gu, r * 2 * F + F + c);
  St(out, i, g * Sigmoid(g) * u);
}

template <typename T>
__global__ void SwigluBack(T* dgu, const T* gu, const T* dout, int N, int F) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(N) * F) return;
  const size_t r = i / F, c = i % F;
  const float g = Ld(gu, r * 2 * F + c), u = Ld(gu, r * 2 * F + F + c), d = Ld(dout, i);
  const float s = Sigmoid(g);
  St(dgu, r * 2 * F + c, d * u * s * (1.0f + g * (1.0f - s)));
  St(dgu, r * 2 * F + F + c, d * g * s);
}

}  // namespace

void SwigluForward(DType t, void* out, const void* gu, int N, int F, cudaStream_t stream) {
  KEEL_TYPED_LAUNCH(t, size_t(N) * F, kThreads,
                    (Swiglu<U><<<blocks, kThreads, 0, stream>>>(static_cast<U*>(out),
                                                                static_cast<const U*>(gu), N, F)));
}

void SwigluBackward(DType t, void* dgu, const void* gu, const void* dout, int N, int F,
                    cudaStream_t stream) {
  KEEL_TYPED_LAUNCH(
      t, size_t(N) * F, kThreads,
      (SwigluBack<U><<<blocks, kThreads, 0, stream>>>(
          static_cast<U*>(dgu), static_cast<const U*>(gu), static_cast<const U*>(dout), N, F)));
}

}  // namespace keel::kernels::cuda

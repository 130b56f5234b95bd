// Token and position embeddings (contract: cpu/encoder.h): a gather forward, a scatter-add
// backward.
#include <type_traits>

#include "keel/kernels/cuda/encoder.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void Embed(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                      int C, int v0, int v1) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(B) * T_ * C) return;
  const size_t bt = i / C;
  const int c = int(i % C), t = int(bt % T_), tok = tokens[bt];
  float x = tok >= v0 && tok < v1 ? Ld(wte, size_t(tok - v0) * C + c) : 0.0f;
  if (wpe) x += Ld(wpe, size_t(t) * C + c);
  St(out, i, x);
}

// dwte rows gather with atomics (fp32): the order of the adds, so the last bits, vary by run.
template <typename T>
__global__ void EmbedBackWte(float* dwte, const T* dout, const int32_t* tokens, int BT, int C,
                             int v0, int v1) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(BT) * C) return;
  const int tok = tokens[i / C];
  if (tok >= v0 && tok < v1) atomicAdd(dwte + size_t(tok - v0) * C + i % C, Ld(dout, i));
}

template <typename T>
__global__ void EmbedBackWpe(float* dwpe, const T* dout, int B, int T_, int C) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(T_) * C) return;
  float s = 0.0f;
  for (int b = 0; b < B; ++b) s += Ld(dout, size_t(b) * T_ * C + i);
  dwpe[i] += s;
}

}  // namespace

void EncoderForward(DType t, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                    int B, int T_, int C, int v0, int v1, cudaStream_t stream) {
  KEEL_TYPED_LAUNCH(t, size_t(B) * T_ * C, kThreads,
                    (Embed<U><<<blocks, kThreads, 0, stream>>>(
                        static_cast<U*>(out), tokens, static_cast<const U*>(wte),
                        static_cast<const U*>(wpe), B, T_, C, v0, v1)));
}

void EncoderBackward(DType t, float* dwte, float* dwpe, const void* dout, const int32_t* tokens,
                     int B, int T_, int C, int v0, int v1, cudaStream_t stream) {
  KEEL_TYPED_LAUNCH(t, size_t(B) * T_ * C, kThreads,
                    (EmbedBackWte<U><<<blocks, kThreads, 0, stream>>>(
                        dwte, static_cast<const U*>(dout), tokens, B * T_, C, v0, v1)));
  if (!dwpe) return;
  KEEL_TYPED_LAUNCH(t, size_t(T_) * C, kThreads,
                    (EmbedBackWpe<U><<<blocks, kThreads, 0, stream>>>(
                        dwpe, static_cast<const U*>(dout), B, T_, C)));
}

}  // namespace keel::kernels::cuda

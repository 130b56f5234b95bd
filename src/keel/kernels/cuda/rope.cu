// Rotary position embedding, in place (contract: cpu/rope.h): one thread per rotated pair.
#include <cmath>
#include <type_traits>

#include "keel/kernels/cuda/rope.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

// One thread per (b, t, q or k head, i < hs/2).
template <typename T>
__global__ void RopeKernel(T* qkv, int B, int T_, int NH, int NKV, int hs, float theta, int pos0,
                           float sign) {
  const int h2 = hs / 2, heads = NH + NKV;
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(B) * T_ * heads * h2) return;
  const int i = int(idx % h2), head = int(idx / h2 % heads);
  const size_t bt = idx / h2 / heads;
  const int t = int(bt % T_);
  const double a = double(pos0 + t) * pow(double(theta), -2.0 * i / hs);
  const float c = float(cos(a)), s = sign * float(sin(a));
  T* x = qkv + bt * size_t(NH + 2 * NKV) * hs + size_t(head) * hs;
  const float x0 = Ld(x, i), x1 = Ld(x, i + h2);
  St(x, i, x0 * c - x1 * s);
  St(x, i + h2, x1 * c + x0 * s);
}

}  // namespace

void Rope(DType t, void* qkv, int B, int T_, int NH, int NKV, int hs, float theta, int pos0,
          bool backward, cudaStream_t stream) {
  KEEL_TYPED_LAUNCH(
      t, size_t(B) * T_ * (NH + NKV) * (hs / 2), kThreads,
      (RopeKernel<U><<<blocks, kThreads, 0, stream>>>(static_cast<U*>(qkv), B, T_, NH, NKV, hs,
                                                      theta, pos0, backward ? -1.0f : 1.0f)));
}

}  // namespace keel::kernels::cuda

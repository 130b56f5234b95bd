// Causal attention, flash-style (the contract is cpu/attention.h's): each query row keeps a
// running max, sum and output over key tiles staged in shared memory, so no T×T scores exist.
// Backward recomputes the probabilities from the saved log-sum-exp, with D_i = dout_i·out_i:
// one kernel per key row for dk, dv (summed over the group's query heads, no atomics) and one
// per query row for dq. A thread holds one row's head vector(s): simple, for fp32 and any
// hs ≤ 128. bf16 with hs of 16, 32, 64 or 128 goes to the tensor-core kernels (attention_tc.cu).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "keel/core/error.h"
#include "keel/kernels/cuda/attention.cuh"
#include "keel/kernels/cuda/attention_tc.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr int kMaxHs = 128;
constexpr int kRows = 64;  // query (or key) rows per block: one per thread
constexpr int kTile = 32;  // rows staged in shared memory per iteration

using Shape = AttnShape;

// bf16 with a head size the tensor-core kernels take, unless KEEL_CUDA_ATTENTION=simple (the
// tests run both).
bool UseTensorCores(DType t, int hs) {
  const char* v = std::getenv("KEEL_CUDA_ATTENTION");
  return t == DType::kBF16 && TensorCoreAttention(hs) && !(v && std::strcmp(v, "simple") == 0);
}

// Keys and values [j0, j0 + kTile) of kv head g into shared memory (fp32), zeros past T.
template <typename T>
__device__ void LoadKeysValues(float* Ks, float* Vs, const T* base, int j0, int g, const Shape& s) {
  for (int e = threadIdx.x; e < kTile * s.hs; e += blockDim.x) {
    const int j = j0 + e / s.hs, d = e % s.hs;
    const size_t row = size_t(j) * s.W;
    Ks[e] = j < s.T ? Ld(base, row + s.C + g * s.hs + d) : 0.0f;
    Vs[e] = j < s.T ? Ld(base, row + s.C + s.NKV * s.hs + g * s.hs + d) : 0.0f;
  }
}

template <typename T>
__global__ void Forward(T* out, float* lse, const T* qkv, Shape s) {
  extern __shared__ float sh[];
  float* Ks = sh;
  float* Vs = sh + kTile * s.hs;
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kRows + threadIdx.x;
  const int g = h / (s.NH / s.NKV);
  const T* base = qkv + size_t(b) * s.T * s.W;
  const bool valid = i < s.T;
  float q[kMaxHs], acc[kMaxHs];
  for (int d = 0; d < s.hs; ++d) {
    q[d] = valid ? Ld(base, size_t(i) * s.W + h * s.hs + d) * s.scale : 0.0f;
    acc[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int last = min(s.T - 1, int(blockIdx.x) * kRows + kRows - 1);
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    LoadKeysValues(Ks, Vs, base, j0, g, s);
    __syncthreads();
    if (valid)
      for (int jj = 0; jj < kTile && j0 + jj <= i; ++jj) {
        float sc = 0.0f;
        for (int d = 0; d < s.hs; ++d) sc += q[d] * Ks[jj * s.hs + d];
        if (sc > m) {
          const float corr = __expf(m - sc);
          l *= corr;
          for (int d = 0; d < s.hs; ++d) acc[d] *= corr;
          m = sc;
        }
        const float p = __expf(sc - m);
        l += p;
        for (int d = 0; d < s.hs; ++d) acc[d] += p * Vs[jj * s.hs + d];
      }
    __syncthreads();
  }
  if (!valid) return;
  T* o = out + (size_t(b) * s.T + i) * s.C + h * s.hs;
  for (int d = 0; d < s.hs; ++d) St(o, d, acc[d] / l);
  lse[(size_t(b) * s.NH + h) * s.T + i] = m + logf(l);
}

// D (B,NH,T) = Σ_d dout·out per row and head.
template <typename T>
__global__ void RowDots(float* D, const T* dout, const T* out, Shape s, int B) {
  const size_t idx = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= size_t(B) * s.NH * s.T) return;
  const int i = int(idx % s.T), h = int(idx / s.T % s.NH), b = int(idx / s.T / s.NH);
  const size_t at = (size_t(b) * s.T + i) * s.C + h * s.hs;
  float acc = 0.0f;
  for (int d = 0; d < s.hs; ++d) acc += Ld(dout, at + d) * Ld(out, at + d);
  D[idx] = acc;
}

// One thread per key row j of kv head g: dk_j, dv_j over the group's query heads and rows i ≥ j.
template <typename T>
__global__ void BackwardKV(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                           Shape s) {
  extern __shared__ float sh[];
  float* Qs = sh;
  float* dOs = sh + kTile * s.hs;
  const int b = blockIdx.z, g = blockIdx.y, j = blockIdx.x * kRows + threadIdx.x;
  const bool valid = j < s.T;
  const T* base = qkv + size_t(b) * s.T * s.W;
  float k[kMaxHs], v[kMaxHs], dk[kMaxHs], dv[kMaxHs];
  for (int d = 0; d < s.hs; ++d) {
    k[d] = valid ? Ld(base, size_t(j) * s.W + s.C + g * s.hs + d) : 0.0f;
    v[d] = valid ? Ld(base, size_t(j) * s.W + s.C + s.NKV * s.hs + g * s.hs + d) : 0.0f;
    dk[d] = dv[d] = 0.0f;
  }
  const int group = s.NH / s.NKV, first = int(blockIdx.x) * kRows;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const float* lse_h = lse + (size_t(b) * s.NH + h) * s.T;
    const float* D_h = D + (size_t(b) * s.NH + h) * s.T;
    for (int i0 = first; i0 < s.T; i0 += kTile) {
      for (int e = threadIdx.x; e < kTile * s.hs; e += blockDim.x) {
        const int i = i0 + e / s.hs, d = e % s.hs;
        Qs[e] = i < s.T ? Ld(base, size_t(i) * s.W + h * s.hs + d) : 0.0f;
        dOs[e] = i < s.T ? Ld(dout, (size_t(b) * s.T + i) * s.C + h * s.hs + d) : 0.0f;
      }
      __syncthreads();
      if (valid)
        for (int ii = 0; ii < kTile && i0 + ii < s.T; ++ii) {
          const int i = i0 + ii;
          if (i < j) continue;
          float sc = 0.0f, dp = 0.0f;
          for (int d = 0; d < s.hs; ++d) {
            sc += Qs[ii * s.hs + d] * k[d];
            dp += dOs[ii * s.hs + d] * v[d];
          }
          const float p = __expf(sc * s.scale - lse_h[i]);
          const float ds = p * (dp - D_h[i]) * s.scale;
          for (int d = 0; d < s.hs; ++d) {
            dv[d] += p * dOs[ii * s.hs + d];
            dk[d] += ds * Qs[ii * s.hs + d];
          }
        }
      __syncthreads();
    }
  }
  if (!valid) return;
  T* row = dqkv + (size_t(b) * s.T + j) * s.W;
  for (int d = 0; d < s.hs; ++d) {
    St(row, s.C + g * s.hs + d, dk[d]);
    St(row, s.C + s.NKV * s.hs + g * s.hs + d, dv[d]);
  }
}

// One thread per query row i of head h: dq_i = Σ_{j ≤ i} ds_ij·k_j.
template <typename T>
__global__ void BackwardQ(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                          Shape s) {
  extern __shared__ float sh[];
  float* Ks = sh;
  float* Vs = sh + kTile * s.hs;
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x * kRows + threadIdx.x;
  const int g = h / (s.NH / s.NKV);
  const bool valid = i < s.T;
  const T* base = qkv + size_t(b) * s.T * s.W;
  float q[kMaxHs], dO[kMaxHs], dq[kMaxHs];
  for (int d = 0; d < s.hs; ++d) {
    q[d] = valid ? Ld(base, size_t(i) * s.W + h * s.hs + d) : 0.0f;
    dO[d] = valid ? Ld(dout, (size_t(b) * s.T + i) * s.C + h * s.hs + d) : 0.0f;
    dq[d] = 0.0f;
  }
  const size_t stat = (size_t(b) * s.NH + h) * s.T + (valid ? i : 0);
  const float L = lse[stat], Di = D[stat];
  const int last = min(s.T - 1, int(blockIdx.x) * kRows + kRows - 1);
  for (int j0 = 0; j0 <= last; j0 += kTile) {
    LoadKeysValues(Ks, Vs, base, j0, g, s);
    __syncthreads();
    if (valid)
      for (int jj = 0; jj < kTile && j0 + jj <= i; ++jj) {
        float sc = 0.0f, dp = 0.0f;
        for (int d = 0; d < s.hs; ++d) {
          sc += q[d] * Ks[jj * s.hs + d];
          dp += dO[d] * Vs[jj * s.hs + d];
        }
        const float p = __expf(sc * s.scale - L);
        const float ds = p * (dp - Di) * s.scale;
        for (int d = 0; d < s.hs; ++d) dq[d] += ds * Ks[jj * s.hs + d];
      }
    __syncthreads();
  }
  if (!valid) return;
  T* row = dqkv + (size_t(b) * s.T + i) * s.W;
  for (int d = 0; d < s.hs; ++d) St(row, h * s.hs + d, dq[d]);
}

Shape ShapeOf(int T, int C, int NH, int NKV) {
  const int hs = C / NH;
  if (hs > kMaxHs)
    ThrowBadInput("CUDA attention: head size " + std::to_string(hs) + " is over " +
                  std::to_string(kMaxHs));
  return {T, C, NH, NKV, hs, C + 2 * NKV * hs, 1.0f / std::sqrt(float(hs))};
}

size_t SharedBytes(const Shape& s) { return size_t(2) * kTile * s.hs * sizeof(float); }

}  // namespace

void AttentionForward(DType t, void* out, float* lse, const void* qkv, int B, int T_, int C, int NH,
                      int NKV, cudaStream_t stream) {
  const Shape s = ShapeOf(T_, C, NH, NKV);
  if (UseTensorCores(t, s.hs))
    return AttentionForwardTC(static_cast<bf16d*>(out), lse, static_cast<const bf16d*>(qkv), B, s,
                              stream);
  const dim3 grid(Blocks(size_t(T_), kRows), NH, B);
  Typed(t, [&](auto* z) {
    using U = std::remove_pointer_t<decltype(z)>;
    Forward<U><<<grid, kRows, SharedBytes(s), stream>>>(static_cast<U*>(out), lse,
                                                        static_cast<const U*>(qkv), s);
  });
  KEEL_CUDA(cudaGetLastError());
}

void AttentionBackward(DType t, void* dqkv, const void* dout, const void* qkv, const void* out,
                       const float* lse, int B, int T_, int C, int NH, int NKV,
                       cudaStream_t stream) {
  const Shape s = ShapeOf(T_, C, NH, NKV);
  float* D = static_cast<float*>(Scratch(5, sizeof(float) * size_t(B) * NH * T_, stream));
  Typed(t, [&](auto* z) {
    using U = std::remove_pointer_t<decltype(z)>;
    const U* o = static_cast<const U*>(out);
    const U* d = static_cast<const U*>(dout);
    const U* x = static_cast<const U*>(qkv);
    U* dx = static_cast<U*>(dqkv);
    RowDots<U><<<Blocks(size_t(B) * NH * T_, 256), 256, 0, stream>>>(D, d, o, s, B);
    if constexpr (std::is_same_v<U, bf16d>)
      if (UseTensorCores(t, s.hs)) return AttentionBackwardTC(dx, d, x, lse, D, B, s, stream);
    BackwardKV<U><<<dim3(Blocks(size_t(T_), kRows), NKV, B), kRows, SharedBytes(s), stream>>>(
        dx, d, x, lse, D, s);
    BackwardQ<U><<<dim3(Blocks(size_t(T_), kRows), NH, B), kRows, SharedBytes(s), stream>>>(
        dx, d, x, lse, D, s);
  });
  KEEL_CUDA(cudaGetLastError());
}

}  // namespace keel::kernels::cuda

// Causal attention on tensor cores (bf16, head sizes 16, 32, 64, 128): FlashAttention-2's tiling
// with WMMA 16×16×16 products. A block of 4 warps holds 64 query rows (forward, dq) or 64 key rows
// (dk, dv), each warp 16 of them; score tiles, probabilities and the running output live in shared
// memory between the products, so the per-row softmax bookkeeping needs no knowledge of the
// fragments' layouts. Probabilities and their gradients enter the products rounded to bf16, as in
// FlashAttention. attention.cu dispatches here and keeps the fp32 and odd-size cases.
#include <mma.h>

#include <cmath>

#include "keel/kernels/cuda/attention_tc.cuh"

namespace keel::kernels::cuda {
namespace {

using namespace nvcuda;

constexpr int kB = 64;  // rows per block and tile
constexpr int kThreads = 128;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16d, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16d, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16d, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Causal work grows with the query tile: the heaviest tiles are issued first (a shorter tail).
__device__ int QueryTile() { return int(gridDim.x - 1 - blockIdx.x) * kB; }

// Rows [r0, r0 + kB) of a head's channels (qkv row width W, channel offset `col`) into shared
// memory, zeros past T.
template <int HS>
__device__ void LoadRows(bf16d* dst, const bf16d* base, int r0, int T, size_t W, int col) {
  for (int e = threadIdx.x; e < kB * HS; e += kThreads) {
    const int r = e / HS, d = e % HS, i = r0 + r;
    dst[e] = i < T ? base[size_t(i) * W + col + d] : __float2bfloat16(0.0f);
  }
}

// C (16 × 16·cols, fp32 in shared, ldc) op= A (16 × K, bf16 row-major, lda) · B, where B is
// K × (16·cols): row-major (ldb) or, with kTransB, the transpose of a row-major (16·cols) × K.
// `accumulate`: C is loaded first.
template <bool kTransB, int K>
__device__ void WarpProduct(float* C, int ldc, const bf16d* A, int lda, const bf16d* B, int ldb,
                            int cols, bool accumulate) {
  for (int c = 0; c < cols; ++c) {
    FragC acc;
    if (accumulate)
      wmma::load_matrix_sync(acc, C + 16 * c, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < K; k += 16) {
      FragA a;
      wmma::load_matrix_sync(a, A + k, lda);
      if constexpr (kTransB) {
        FragBCol b;
        wmma::load_matrix_sync(b, B + size_t(16 * c) * ldb + k, ldb);
        wmma::mma_sync(acc, a, b, acc);
      } else {
        FragBRow b;
        wmma::load_matrix_sync(b, B + size_t(k) * ldb + 16 * c, ldb);
        wmma::mma_sync(acc, a, b, acc);
      }
    }
    wmma::store_matrix_sync(C + 16 * c, acc, ldc, wmma::mem_row_major);
  }
}

template <int HS>
__global__ void __launch_bounds__(kThreads)
    Forward(bf16d* out, float* lse, const bf16d* qkv, AttnShape s) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16d* Qs = reinterpret_cast<bf16d*>(smem);
  bf16d* Ks = Qs + kB * HS;
  bf16d* Vs = Ks + kB * HS;
  float* S = reinterpret_cast<float*>(Vs + kB * HS);
  bf16d* P = reinterpret_cast<bf16d*>(S + kB * kB);
  float* O = reinterpret_cast<float*>(P + kB * kB);
  float* m = O + kB * HS;
  float* l = m + kB;
  const int b = blockIdx.z, h = blockIdx.y, q0 = QueryTile();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = h / (s.NH / s.NKV);
  const bf16d* base = qkv + size_t(b) * s.T * s.W;
  LoadRows<HS>(Qs, base, q0, s.T, s.W, h * HS);
  for (int e = threadIdx.x; e < kB * HS; e += kThreads) O[e] = 0.0f;
  for (int r = threadIdx.x; r < kB; r += kThreads) m[r] = -INFINITY, l[r] = 0.0f;
  __syncthreads();
  const int last = min(s.T - 1, q0 + kB - 1);
  for (int k0 = 0; k0 <= last; k0 += kB) {
    LoadRows<HS>(Ks, base, k0, s.T, s.W, s.C + g * HS);
    LoadRows<HS>(Vs, base, k0, s.T, s.W, s.C + s.NKV * HS + g * HS);
    __syncthreads();
    WarpProduct<true, HS>(S + 16 * warp * kB, kB, Qs + 16 * warp * HS, HS, Ks, HS, kB / 16, false);
    __syncwarp();
    // The warp's rows one at a time, the lanes across the columns (no bank conflicts).
    for (int rr = 0; rr < 16; ++rr) {
      const int r = 16 * warp + rr, i = q0 + r;
      const int c0 = lane, c1 = lane + 32;
      const float v0 = (k0 + c0 <= i && i < s.T) ? S[r * kB + c0] * s.scale : -INFINITY;
      const float v1 = (k0 + c1 <= i && i < s.T) ? S[r * kB + c1] * s.scale : -INFINITY;
      const float m_old = m[r], m_new = fmaxf(m_old, WarpMax(fmaxf(v0, v1)));
      const float corr = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new);
      const float p0 = v0 == -INFINITY ? 0.0f : __expf(v0 - m_new);
      const float p1 = v1 == -INFINITY ? 0.0f : __expf(v1 - m_new);
      P[r * kB + c0] = __float2bfloat16(p0);
      P[r * kB + c1] = __float2bfloat16(p1);
      const float sum = WarpSum(p0 + p1);
      for (int d = lane; d < HS; d += 32) O[r * HS + d] *= corr;
      __syncwarp();  // every lane has read m[r]
      if (lane == 0) l[r] = l[r] * corr + sum, m[r] = m_new;
    }
    __syncwarp();
    WarpProduct<false, kB>(O + 16 * warp * HS, HS, P + 16 * warp * kB, kB, Vs, HS, HS / 16, true);
    __syncthreads();
  }
  for (int e = threadIdx.x; e < kB * HS; e += kThreads) {
    const int rr = e / HS, ii = q0 + rr;
    if (ii < s.T)
      out[(size_t(b) * s.T + ii) * s.C + h * HS + e % HS] = __float2bfloat16(O[e] / l[rr]);
  }
  for (int rr = threadIdx.x; rr < kB; rr += kThreads)
    if (q0 + rr < s.T) lse[(size_t(b) * s.NH + h) * s.T + q0 + rr] = m[rr] + logf(l[rr]);
}

// Per key block of kv head g: dV = Σ Pᵀ·dO and dK = Σ dSᵀ·Q·scale over the group's heads and the
// query tiles at or after the block, with transposed tiles (keys × queries) so that each warp's
// rows are its keys.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    BackwardKV(bf16d* dqkv, const bf16d* dout, const bf16d* qkv, const float* lse, const float* D,
               AttnShape s) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16d* Ks = reinterpret_cast<bf16d*>(smem);
  bf16d* Vs = Ks + kB * HS;
  bf16d* Qs = Vs + kB * HS;
  bf16d* dOs = Qs + kB * HS;
  float* St = reinterpret_cast<float*>(dOs + kB * HS);
  float* dPt = St + kB * kB;
  bf16d* Pt = reinterpret_cast<bf16d*>(dPt + kB * kB);
  bf16d* dSt = Pt + kB * kB;
  float* dK = reinterpret_cast<float*>(dSt + kB * kB);
  float* dV = dK + kB * HS;
  float* Ls = dV + kB * HS;
  float* Ds = Ls + kB;
  const int b = blockIdx.z, g = blockIdx.y, k0 = blockIdx.x * kB;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bf16d* base = qkv + size_t(b) * s.T * s.W;
  const bf16d* dbase = dout + size_t(b) * s.T * s.C;
  LoadRows<HS>(Ks, base, k0, s.T, s.W, s.C + g * HS);
  LoadRows<HS>(Vs, base, k0, s.T, s.W, s.C + s.NKV * HS + g * HS);
  for (int e = threadIdx.x; e < kB * HS; e += kThreads) dK[e] = dV[e] = 0.0f;
  const int group = s.NH / s.NKV;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const float* lse_h = lse + (size_t(b) * s.NH + h) * s.T;
    const float* D_h = D + (size_t(b) * s.NH + h) * s.T;
    for (int q0 = k0; q0 < s.T; q0 += kB) {
      __syncthreads();  // the previous tile's readers are done
      LoadRows<HS>(Qs, base, q0, s.T, s.W, h * HS);
      LoadRows<HS>(dOs, dbase, q0, s.T, s.C, h * HS);
      for (int c = threadIdx.x; c < kB; c += kThreads) {
        Ls[c] = q0 + c < s.T ? lse_h[q0 + c] : 0.0f;
        Ds[c] = q0 + c < s.T ? D_h[q0 + c] : 0.0f;
      }
      __syncthreads();
      const int row = 16 * warp;
      WarpProduct<true, HS>(St + row * kB, kB, Ks + row * HS, HS, Qs, HS, kB / 16, false);
      WarpProduct<true, HS>(dPt + row * kB, kB, Vs + row * HS, HS, dOs, HS, kB / 16, false);
      __syncwarp();
      for (int e = lane; e < 16 * kB; e += 32) {
        const int r = row + e / kB, c = e % kB, j = k0 + r, i = q0 + c;
        const bool valid = i >= j && i < s.T && j < s.T;
        const float p = valid ? __expf(St[r * kB + c] * s.scale - Ls[c]) : 0.0f;
        Pt[r * kB + c] = __float2bfloat16(p);
        dSt[r * kB + c] = __float2bfloat16(p * (dPt[r * kB + c] - Ds[c]) * s.scale);
      }
      __syncwarp();
      WarpProduct<false, kB>(dV + row * HS, HS, Pt + row * kB, kB, dOs, HS, HS / 16, true);
      WarpProduct<false, kB>(dK + row * HS, HS, dSt + row * kB, kB, Qs, HS, HS / 16, true);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kB * HS; e += kThreads) {
    const int r = e / HS, d = e % HS, j = k0 + r;
    if (j >= s.T) continue;
    bf16d* row = dqkv + (size_t(b) * s.T + j) * s.W;
    row[s.C + g * HS + d] = __float2bfloat16(dK[e]);
    row[s.C + s.NKV * HS + g * HS + d] = __float2bfloat16(dV[e]);
  }
}

// Per query tile of head h: dQ = Σ_j dS·K·scale over the key tiles at or before it.
template <int HS>
__global__ void __launch_bounds__(kThreads)
    BackwardQ(bf16d* dqkv, const bf16d* dout, const bf16d* qkv, const float* lse, const float* D,
              AttnShape s) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16d* Qs = reinterpret_cast<bf16d*>(smem);
  bf16d* dOs = Qs + kB * HS;
  bf16d* Ks = dOs + kB * HS;
  bf16d* Vs = Ks + kB * HS;
  float* S = reinterpret_cast<float*>(Vs + kB * HS);
  float* dP = S + kB * kB;
  bf16d* dS = reinterpret_cast<bf16d*>(dP + kB * kB);
  float* dQ = reinterpret_cast<float*>(dS + kB * kB);
  float* Ls = dQ + kB * HS;
  float* Ds = Ls + kB;
  const int b = blockIdx.z, h = blockIdx.y, q0 = QueryTile();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = h / (s.NH / s.NKV);
  const bf16d* base = qkv + size_t(b) * s.T * s.W;
  LoadRows<HS>(Qs, base, q0, s.T, s.W, h * HS);
  LoadRows<HS>(dOs, dout + size_t(b) * s.T * s.C, q0, s.T, s.C, h * HS);
  for (int e = threadIdx.x; e < kB * HS; e += kThreads) dQ[e] = 0.0f;
  const size_t stat = (size_t(b) * s.NH + h) * s.T;
  for (int r = threadIdx.x; r < kB; r += kThreads) {
    Ls[r] = q0 + r < s.T ? lse[stat + q0 + r] : 0.0f;
    Ds[r] = q0 + r < s.T ? D[stat + q0 + r] : 0.0f;
  }
  const int last = min(s.T - 1, q0 + kB - 1), row = 16 * warp;
  for (int k0 = 0; k0 <= last; k0 += kB) {
    __syncthreads();
    LoadRows<HS>(Ks, base, k0, s.T, s.W, s.C + g * HS);
    LoadRows<HS>(Vs, base, k0, s.T, s.W, s.C + s.NKV * HS + g * HS);
    __syncthreads();
    WarpProduct<true, HS>(S + row * kB, kB, Qs + row * HS, HS, Ks, HS, kB / 16, false);
    WarpProduct<true, HS>(dP + row * kB, kB, dOs + row * HS, HS, Vs, HS, kB / 16, false);
    __syncwarp();
    for (int e = lane; e < 16 * kB; e += 32) {
      const int r = row + e / kB, c = e % kB, i = q0 + r, j = k0 + c;
      const bool valid = j <= i && i < s.T;
      const float p = valid ? __expf(S[r * kB + c] * s.scale - Ls[r]) : 0.0f;
      dS[r * kB + c] = __float2bfloat16(p * (dP[r * kB + c] - Ds[r]) * s.scale);
    }
    __syncwarp();
    WarpProduct<false, kB>(dQ + row * HS, HS, dS + row * kB, kB, Ks, HS, HS / 16, true);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kB * HS; e += kThreads) {
    const int r = e / HS, i = q0 + r;
    if (i < s.T) dqkv[(size_t(b) * s.T + i) * s.W + h * HS + e % HS] = __float2bfloat16(dQ[e]);
  }
}

template <int HS>
constexpr size_t ForwardBytes() {
  return 3 * kB * HS * 2 + kB * kB * 4 + kB * kB * 2 + kB * HS * 4 + 2 * kB * 4;
}
template <int HS>
constexpr size_t BackwardKVBytes() {
  return 4 * kB * HS * 2 + 2 * kB * kB * 4 + 2 * kB * kB * 2 + 2 * kB * HS * 4 + 2 * kB * 4;
}
template <int HS>
constexpr size_t BackwardQBytes() {
  return 4 * kB * HS * 2 + 2 * kB * kB * 4 + kB * kB * 2 + kB * HS * 4 + 2 * kB * 4;
}

// Each kernel's dynamic shared memory above 48 KB, allowed once (a `static` per instantiation).
template <typename Kernel>
void AllowShared(Kernel k, size_t bytes) {
  KEEL_CUDA(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <int HS>
void ForwardHs(bf16d* out, float* lse, const bf16d* qkv, int B, const AttnShape& s,
               cudaStream_t stream) {
  static const bool allowed = (AllowShared(Forward<HS>, ForwardBytes<HS>()), true);
  (void)allowed;
  Forward<HS><<<dim3((s.T + kB - 1) / kB, s.NH, B), kThreads, ForwardBytes<HS>(), stream>>>(
      out, lse, qkv, s);
}

template <int HS>
void BackwardHs(bf16d* dqkv, const bf16d* dout, const bf16d* qkv, const float* lse, const float* D,
                int B, const AttnShape& s, cudaStream_t stream) {
  static const bool allowed = (AllowShared(BackwardKV<HS>, BackwardKVBytes<HS>()),
                               AllowShared(BackwardQ<HS>, BackwardQBytes<HS>()), true);
  (void)allowed;
  const int tiles = (s.T + kB - 1) / kB;
  BackwardKV<HS><<<dim3(tiles, s.NKV, B), kThreads, BackwardKVBytes<HS>(), stream>>>(
      dqkv, dout, qkv, lse, D, s);
  BackwardQ<HS><<<dim3(tiles, s.NH, B), kThreads, BackwardQBytes<HS>(), stream>>>(dqkv, dout, qkv,
                                                                                  lse, D, s);
}

}  // namespace

bool TensorCoreAttention(int hs) { return hs == 16 || hs == 32 || hs == 64 || hs == 128; }

void AttentionForwardTC(bf16d* out, float* lse, const bf16d* qkv, int B, const AttnShape& s,
                        cudaStream_t stream) {
  switch (s.hs) {
    case 16:
      ForwardHs<16>(out, lse, qkv, B, s, stream);
      break;
    case 32:
      ForwardHs<32>(out, lse, qkv, B, s, stream);
      break;
    case 64:
      ForwardHs<64>(out, lse, qkv, B, s, stream);
      break;
    default:
      ForwardHs<128>(out, lse, qkv, B, s, stream);
      break;
  }
  KEEL_CUDA(cudaGetLastError());
}

void AttentionBackwardTC(bf16d* dqkv, const bf16d* dout, const bf16d* qkv, const float* lse,
                         const float* D, int B, const AttnShape& s, cudaStream_t stream) {
  switch (s.hs) {
    case 16:
      BackwardHs<16>(dqkv, dout, qkv, lse, D, B, s, stream);
      break;
    case 32:
      BackwardHs<32>(dqkv, dout, qkv, lse, D, B, s, stream);
      break;
    case 64:
      BackwardHs<64>(dqkv, dout, qkv, lse, D, B, s, stream);
      break;
    default:
      BackwardHs<128>(dqkv, dout, qkv, lse, D, B, s, stream);
      break;
  }
  KEEL_CUDA(cudaGetLastError());
}

}  // namespace keel::kernels::cuda

// Elementwise and gather/scatter kernels: GELU, SwiGLU, rotary embedding, the embeddings, AdamW,
// and the small reductions and conversions the step uses (contracts in the cpu/ headers).
#include <cmath>
#include <type_traits>

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

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

__global__ void AdamWKernel(float* master, bf16d* working, float* m, float* v, const float* g,
                            size_t n, AdamWParams p, float bc1, float bc2) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float gi = g[i] * p.grad_scale;
  const float mi = p.beta1 * m[i] + (1.0f - p.beta1) * gi;
  const float vi = p.beta2 * v[i] + (1.0f - p.beta2) * gi * gi;
  m[i] = mi;
  v[i] = vi;
  const float w = master[i];
  const float updated = w - p.lr * ((mi / bc1) / (sqrtf(vi / bc2) + p.eps) + p.weight_decay * w);
  master[i] = updated;
  if (working) working[i] = __float2bfloat16_rn(updated);
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

__global__ void AddToKernel(float* dst, const float* src, size_t n) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

template <typename T>
__global__ void AddBiasKernel(T* out, const float* bias, int M, int N) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < size_t(M) * N) St(out, i, Ld(out, i) + bias[i % N]);
}

// Launches kernel<U> for the element type of `t` over n threads.
#define KEEL_TYPED_LAUNCH(t, n, body)             \
  Typed(t, [&](auto* z) {                         \
    using U = std::remove_pointer_t<decltype(z)>; \
    const unsigned blocks = Blocks(n, kThreads);  \
    if (blocks) body;                             \
  });                                             \
  KEEL_CUDA(cudaGetLastError())

}  // namespace

void GeluForward(DType t, void* out, const void* inp, size_t n) {
  KEEL_TYPED_LAUNCH(
      t, n, (Gelu<U><<<blocks, kThreads>>>(static_cast<U*>(out), static_cast<const U*>(inp), n)));
}

void GeluBackward(DType t, void* dinp, const void* inp, const void* dout, size_t n) {
  KEEL_TYPED_LAUNCH(
      t, n,
      (GeluBack<U><<<blocks, kThreads>>>(static_cast<U*>(dinp), static_cast<const U*>(inp),
                                         static_cast<const U*>(dout), n)));
}

void SwigluForward(DType t, void* out, const void* gu, int N, int F) {
  KEEL_TYPED_LAUNCH(
      t, size_t(N) * F,
      (Swiglu<U><<<blocks, kThreads>>>(static_cast<U*>(out), static_cast<const U*>(gu), N, F)));
}

void SwigluBackward(DType t, void* dgu, const void* gu, const void* dout, int N, int F) {
  KEEL_TYPED_LAUNCH(
      t, size_t(N) * F,
      (SwigluBack<U><<<blocks, kThreads>>>(static_cast<U*>(dgu), static_cast<const U*>(gu),
                                           static_cast<const U*>(dout), N, F)));
}

void Rope(DType t, void* qkv, int B, int T_, int NH, int NKV, int hs, float theta, int pos0,
          bool backward) {
  KEEL_TYPED_LAUNCH(t, size_t(B) * T_ * (NH + NKV) * (hs / 2),
                    (RopeKernel<U><<<blocks, kThreads>>>(static_cast<U*>(qkv), B, T_, NH, NKV, hs,
                                                         theta, pos0, backward ? -1.0f : 1.0f)));
}

void EncoderForward(DType t, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                    int B, int T_, int C, int v0, int v1) {
  KEEL_TYPED_LAUNCH(
      t, size_t(B) * T_ * C,
      (Embed<U><<<blocks, kThreads>>>(static_cast<U*>(out), tokens, static_cast<const U*>(wte),
                                      static_cast<const U*>(wpe), B, T_, C, v0, v1)));
}

void EncoderBackward(DType t, float* dwte, float* dwpe, const void* dout, const int32_t* tokens,
                     int B, int T_, int C, int v0, int v1) {
  KEEL_TYPED_LAUNCH(t, size_t(B) * T_ * C,
                    (EmbedBackWte<U><<<blocks, kThreads>>>(dwte, static_cast<const U*>(dout),
                                                           tokens, B * T_, C, v0, v1)));
  if (!dwpe) return;
  KEEL_TYPED_LAUNCH(
      t, size_t(T_) * C,
      (EmbedBackWpe<U><<<blocks, kThreads>>>(dwpe, static_cast<const U*>(dout), B, T_, C)));
}

void AdamW(float* master, bf16* working, float* m, float* v, const float* g, size_t n,
           const AdamWParams& p) {
  if (n == 0) return;
  const float bc1 = float(1.0 - std::pow(double(p.beta1), p.step));
  const float bc2 = float(1.0 - std::pow(double(p.beta2), p.step));
  AdamWKernel<<<Blocks(n, kThreads), kThreads>>>(master, reinterpret_cast<bf16d*>(working), m, v, g,
                                                 n, p, bc1, bc2);
  KEEL_CUDA(cudaGetLastError());
}

double SumSquares(const float* x, size_t n) {
  if (n == 0) return 0.0;
  double* partial = static_cast<double*>(Scratch(4, sizeof(double) * (kSumBlocks + 1)));
  SquarePartials<<<kSumBlocks, kThreads>>>(partial, x, n);
  SumPartials<<<1, 1>>>(partial + kSumBlocks, partial, kSumBlocks);
  KEEL_CUDA(cudaGetLastError());
  double out = 0;
  KEEL_CUDA(cudaMemcpy(&out, partial + kSumBlocks, sizeof out, cudaMemcpyDeviceToHost));
  return out;
}

void ToBf16(bf16* out, const float* in, size_t n) {
  if (n == 0) return;
  ToBf16Kernel<<<Blocks(n, kThreads), kThreads>>>(reinterpret_cast<bf16d*>(out), in, n);
  KEEL_CUDA(cudaGetLastError());
}

void AddTo(float* dst, const float* src, size_t n) {
  if (n == 0) return;
  AddToKernel<<<Blocks(n, kThreads), kThreads>>>(dst, src, n);
  KEEL_CUDA(cudaGetLastError());
}

void AddBias(DType t, void* out, const float* bias, int M, int N) {
  KEEL_TYPED_LAUNCH(t, size_t(M) * N,
                    (AddBiasKernel<U><<<blocks, kThreads>>>(static_cast<U*>(out), bias, M, N)));
}

}  // namespace keel::kernels::cuda

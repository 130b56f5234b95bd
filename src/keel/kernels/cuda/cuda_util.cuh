// Shared by the CUDA backend's kernels: error checks, bf16/fp32 loads and stores, launch sizes,
// and the declarations of each file's host-side entry points. Internal to kernels/cuda/.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "keel/core/dtype.h"
#include "keel/kernels/op_args.h"

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

inline unsigned Blocks(size_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

// Calls f with a null pointer of the device type of `t` (float or __nv_bfloat16).
template <typename F>
void Typed(DType t, F&& f) {
  if (t == DType::kF32)
    f(static_cast<float*>(nullptr));
  else
    f(static_cast<bf16d*>(nullptr));
}

// Device scratch that grows on demand and is kept (one per process: the backend is used from one
// thread, the trainer's).
void* Scratch(int slot, size_t bytes);

// cuBLASLt, row-major: C = alpha·op(A)·op(B) + beta·C, op(A) M×K, op(B) K×N; A and B of `ab`,
// C of `c`; fp32 accumulation (TF32 for fp32 inputs when KEEL_TF32=1).
void Gemm(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
          void* C, int ldc, DType ab, bool c_fp32, float alpha, float beta);

// Entry points of the kernel files (pointers in device memory).
void MatmulForward(DType t, void* out, const void* inp, const void* w, const float* bias, int M,
                   int K, int N, bool accumulate);
void MatmulBackward(DType t, void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                    const void* w, int M, int K, int N);
void AttentionForward(DType t, void* out, float* lse, const void* qkv, int B, int T, int C, int NH,
                      int NKV);
void AttentionBackward(DType t, void* dqkv, const void* dout, const void* qkv, const void* out,
                       const float* lse, int B, int T, int C, int NH, int NKV);
void LayerNormForward(DType t, void* out, float* mean, float* rstd, const void* inp, const void* w,
                      const void* b, int N, int C);
void LayerNormBackward(DType t, void* dinp, float* dw, float* db, const void* dout, const void* inp,
                       const void* w, const float* mean, const float* rstd, int N, int C);
void RmsNormForward(DType t, void* out, float* rstd, const void* inp, const void* w, int N, int C,
                    float eps);
void RmsNormBackward(DType t, void* dinp, float* dw, const void* dout, const void* inp,
                     const void* w, const float* rstd, int N, int C);
void GeluForward(DType t, void* out, const void* inp, size_t n);
void GeluBackward(DType t, void* dinp, const void* inp, const void* dout, size_t n);
void SwigluForward(DType t, void* out, const void* gu, int N, int F);
void SwigluBackward(DType t, void* dgu, const void* gu, const void* dout, int N, int F);
void Rope(DType t, void* qkv, int B, int T, int NH, int NKV, int hs, float theta, int pos0,
          bool backward);
void EncoderForward(DType t, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                    int B, int T, int C, int v0, int v1);
void EncoderBackward(DType t, float* dwte, float* dwpe, const void* dout, const int32_t* tokens,
                     int B, int T, int C, int v0, int v1);
void Classifier(DType t, float* losses, void* dx, float* dwte, const void* x, const void* wte,
                const int32_t* targets, float dloss, int M, int C, int V, int Vp);
void ClassifierLogits(DType t, float* logits, const void* x, const void* wte, int M, int C, int V);
void AdamW(float* master, bf16* working, float* m, float* v, const float* g, size_t n,
           const AdamWParams& p);
double SumSquares(const float* x, size_t n);
void ToBf16(bf16* out, const float* in, size_t n);
void AddTo(float* dst, const float* src, size_t n);
// out (M,N) += bias (N) fp32; dbias (N) += Σ rows of d (M,N).
void AddBias(DType t, void* out, const float* bias, int M, int N);
void AddColumnSums(DType t, float* dbias, const void* d, int M, int N);

}  // namespace keel::kernels::cuda

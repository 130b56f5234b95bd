// Matrix products on the GPU through cuBLASLt (matmul.cu): the linear layer forward and backward
// (contract: cpu/matmul.h), and the general product the classifier also uses. Internal to
// kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

// Row-major: C = alpha·op(A)·op(B) + beta·C, op(A) M×K, op(B) K×N; A and B of `ab`, C of `c`;
// fp32 accumulation (TF32 for fp32 inputs when KEEL_TF32=1).
void Gemm(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
          void* C, int ldc, DType ab, bool c_fp32, float alpha, float beta, cudaStream_t stream);

// Row-major C (M×N) = dp·dq·P (M×K)·Q (N×K)ᵀ + beta·C on fp8 tensor cores: P and Q fp8 bytes
// (E4M3, or E5M2 where the flag says; not both E5M2), K contiguous in both (cuBLASLt's fp8 "TN"
// form), dp and dq their dequantization scales (1/scale) in device memory; C bf16 or fp32; fp32
// accumulation. M, N, K multiples of 16 (fp8's alignment; Backend::NativeFp8 checks).
void GemmFp8(int M, int N, int K, const void* P, bool p_e5m2, const void* Q, bool q_e5m2,
             const float* dp, const float* dq, void* C, bool c_fp32, float beta,
             cudaStream_t stream);

// out (M,N) += bias (N, fp32); dbias (N) += Σ rows of d (M,N), in a fixed order.
void AddBias(DType t, void* out, const float* bias, int M, int N, cudaStream_t stream);
void AddColumnSums(DType t, float* dbias, const void* d, int M, int N, cudaStream_t stream);

void MatmulForward(DType t, void* out, const void* inp, const void* w, const float* bias, int M,
                   int K, int N, bool accumulate, float alpha, cudaStream_t stream);
void MatmulBackward(DType t, void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                    const void* w, int M, int K, int N, float alpha, bool accumulate,
                    cudaStream_t stream);

}  // namespace keel::kernels::cuda

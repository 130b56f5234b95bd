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

void MatmulForward(DType t, void* out, const void* inp, const void* w, const float* bias, int M,
                   int K, int N, bool accumulate, float alpha, cudaStream_t stream);
void MatmulBackward(DType t, void* dinp, float* dw, float* dbias, const void* dout, const void* inp,
                    const void* w, int M, int K, int N, float alpha, bool accumulate,
                    cudaStream_t stream);

}  // namespace keel::kernels::cuda

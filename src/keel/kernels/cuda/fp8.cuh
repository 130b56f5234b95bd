// fp8 emulation on the GPU (fp8.cu; contracts: Backend::AbsMax, Backend::Fp8Round). Internal to
// kernels/cuda/.
#pragma once

#include "keel/core/fp8.h"
#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

float AbsMax(DType t, const void* x, size_t n, cudaStream_t stream);
void Fp8Round(DType t, void* out, const void* in, size_t n, float scale, Fp8Format f,
              cudaStream_t stream);

// Backend::MatmulFp8Forward and MatmulFp8Backward (bf16 operands): quantized into fp8 bytes (with
// the transposed copies that cuBLASLt's fp8 form needs for the backward products), then GemmFp8.
void MatmulFp8Forward(bf16* out, const bf16* x, const bf16* w, const float* bias, int M, int K,
                      int N, float sx, float sw, bool accumulate, cudaStream_t stream);
void MatmulFp8Backward(bf16* dinp, float* dweight, const bf16* dout, const bf16* x, const bf16* w,
                       int M, int K, int N, float sdy, float sx, float sw, cudaStream_t stream);

}  // namespace keel::kernels::cuda

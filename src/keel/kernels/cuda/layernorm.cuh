// LayerNorm on the GPU (layernorm.cu; contract: cpu/layernorm.h), and the row kernels it shares
// with RMSNorm (rmsnorm.cu): `rms` drops the mean (and the bias). Internal to kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

void LayerNormForward(DType t, void* out, float* mean, float* rstd, const void* inp, const void* w,
                      const void* b, int N, int C, cudaStream_t stream);
void LayerNormBackward(DType t, void* dinp, float* dw, float* db, const void* dout, const void* inp,
                       const void* w, const float* mean, const float* rstd, int N, int C,
                       cudaStream_t stream);

// Shared with rmsnorm.cu: mean and b null for RMSNorm.
void Norm(DType t, void* out, float* mean, float* rstd, const void* inp, const void* w,
          const void* b, int N, int C, bool rms, float eps, cudaStream_t stream);
void NormBackward(DType t, void* dinp, float* dw, float* db, const void* dout, const void* inp,
                  const void* w, const float* mean, const float* rstd, int N, int C,
                  cudaStream_t stream);

}  // namespace keel::kernels::cuda

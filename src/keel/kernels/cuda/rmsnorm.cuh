// RMSNorm on the GPU (rmsnorm.cu; contract: cpu/rmsnorm.h). Internal to kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

void RmsNormForward(DType t, void* out, float* rstd, const void* inp, const void* w, int N, int C,
                    float eps, cudaStream_t stream);
void RmsNormBackward(DType t, void* dinp, float* dw, const void* dout, const void* inp,
                     const void* w, const float* rstd, int N, int C, cudaStream_t stream);

}  // namespace keel::kernels::cuda

// SwiGLU forward and backward on the GPU (swiglu.cu; contract: cpu/swiglu.h). Internal to
// kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

void SwigluForward(DType t, void* out, const void* gu, int N, int F, cudaStream_t stream);
void SwigluBackward(DType t, void* dgu, const void* gu, const void* dout, int N, int F,
                    cudaStream_t stream);

}  // namespace keel::kernels::cuda

// GELU forward and backward on the GPU (gelu.cu; contract: cpu/gelu.h). Internal to
// kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

void GeluForward(DType t, void* out, const void* inp, size_t n, cudaStream_t stream);
void GeluBackward(DType t, void* dinp, const void* inp, const void* dout, size_t n,
                  cudaStream_t stream);

}  // namespace keel::kernels::cuda

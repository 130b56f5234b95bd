// Token + position embedding on the GPU (encoder.cu; contract: cpu/encoder.h). Internal to
// kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

void EncoderForward(DType t, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                    int B, int T, int C, int v0, int v1, cudaStream_t stream);
void EncoderBackward(DType t, float* dwte, float* dwpe, const void* dout, const int32_t* tokens,
                     int B, int T, int C, int v0, int v1, cudaStream_t stream);

}  // namespace keel::kernels::cuda

// Rotary position embedding on the GPU (rope.cu; contract: cpu/rope.h); `backward` rotates the
// gradient back. Internal to kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

void Rope(DType t, void* qkv, int B, int T, int NH, int NKV, int hs, float theta, int pos0,
          bool backward, cudaStream_t stream);

}  // namespace keel::kernels::cuda

// Causal attention on the GPU (attention.cu; contract: cpu/attention.h): the flash-style kernels
// for fp32 and any head size up to 128, and the dispatch to the tensor-core kernels
// (attention_tc.cuh) for bf16. Internal to kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

void AttentionForward(DType t, void* out, float* lse, const void* qkv, int B, int T, int C, int NH,
                      int NKV, cudaStream_t stream);
void AttentionBackward(DType t, void* dqkv, const void* dout, const void* qkv, const void* out,
                       const float* lse, int B, int T, int C, int NH, int NKV, cudaStream_t stream);

}  // namespace keel::kernels::cuda

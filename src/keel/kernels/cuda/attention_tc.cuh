// The tensor-core attention kernels (attention_tc.cu), called by attention.cu for bf16 heads of
// 16, 32, 64 or 128 channels. Internal to kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

struct AttnShape {
  int T, C, NH, NKV, hs, W;  // W: the width of a qkv row
  float scale;
};

bool TensorCoreAttention(int hs);
void AttentionForwardTC(bf16d* out, float* lse, const bf16d* qkv, int B, const AttnShape& s,
                        cudaStream_t stream);
// D (B,NH,T): Σ_d dout·out per row and head, computed by the caller.
void AttentionBackwardTC(bf16d* dqkv, const bf16d* dout, const bf16d* qkv, const float* lse,
                         const float* D, int B, const AttnShape& s, cudaStream_t stream);

}  // namespace keel::kernels::cuda

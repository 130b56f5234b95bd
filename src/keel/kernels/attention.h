// Causal multi-head self-attention, flash-style: scores are computed one tile at a time with an
// online softmax, so no T×T matrix per head is ever held beyond a tile. Backward recomputes the
// scores from the saved per-row log-sum-exp.
//
// Legend: B batch, T time, C channels, NH heads, hs = C/NH head size.
// qkv (B,T,3C): for each position, q (C) then k (C) then v (C); head h uses channels
// [h·hs, (h+1)·hs) of each.  out (B,T,C).  lse (B,NH,T) fp32: log Σ_j exp(score_ij), where
// score_ij = q_i·k_j / √hs for j ≤ i.
// Backward overwrites dqkv. Statistics and accumulation are fp32 in both precisions.
#pragma once

#include "keel/core/dtype.h"

namespace keel::kernels {

template <typename T>
void AttentionForward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH);

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                       int T_, int C, int NH);

}  // namespace keel::kernels

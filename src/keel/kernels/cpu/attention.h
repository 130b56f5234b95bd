// Causal multi-head self-attention, flash-style: scores are computed one tile at a time with an
// online softmax, so no T×T matrix per head is ever held beyond a tile. Backward recomputes the
// scores from the saved per-row log-sum-exp.
//
// Legend: B batch, T time, C channels, NH query heads, hs = C/NH head size, NKV key/value heads
// (grouped-query attention: query head h reads key/value head h / (NH/NKV); NKV = 0 means NH).
// qkv (B,T,C + 2·NKV·hs): for each position, q (C) then k (NKV·hs) then v (NKV·hs); head h uses
// channels [h·hs, (h+1)·hs) of each.  out (B,T,C).  lse (B,NH,T) fp32: log Σ_j exp(score_ij),
// where score_ij = q_i·k_j / √hs for j ≤ i.
// Backward overwrites dqkv. Statistics and accumulation are fp32 in both precisions.
// doc_start (B·T int32, may be null): document masking for rows that pack several documents;
// query (b, i) sees keys j with doc_start[b·T + i] ≤ j ≤ i only; doc_start[b·T + i] ≤ i, in any
// order (context parallelism's stand-in rows see themselves alone, between rows that see all).
// key_end (B·T int32, may be null): query (b, i) also sees keys j < key_end[b·T + i] only (the
// ring's blocks: queries after the keys they see). Every row must see at least one key.
#pragma once

#include <cstdint>

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void AttentionForward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, int NKV = 0,
                      const int32_t* doc_start = nullptr, const int32_t* key_end = nullptr);

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                       int T_, int C, int NH, int NKV = 0, const int32_t* doc_start = nullptr,
                       const int32_t* key_end = nullptr);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

// The final projection onto the (tied) token embedding fused with softmax cross-entropy, computed
// in vocabulary chunks: only an M×chunk tile of logits exists at a time, never a second M×V
// buffer. Backward recomputes each chunk from the saved per-row log-sum-exp.
//
// Legend: M rows (B*T), C channels, V real vocabulary, Vp padded vocabulary (rows of wte, a
// multiple of 128). Logits of the padded ids [V, Vp) are masked out of the softmax.
// targets (M) int32; a negative target means "no loss at this row".
#pragma once

#include <cstdint>
#include <functional>

#include "keel/core/dtype.h"

namespace keel::kernels {

// Vocabulary parallelism (Megatron-LM's): `wte` holds rows [v0, v0 + Vp) of the padded
// vocabulary, and `combine` turns each tile's per-row statistics over those rows — the
// log-sum-exp (-inf where the shard holds no real id) and the target's logit (0 where another
// shard holds the target) — into the whole vocabulary's, in place: the tensor-parallel ranks'
// all-gather. Losses and softmax gradients are then the whole vocabulary's; dx is this shard's
// term of the sum over the vocabulary, which the caller sums over the shards. Targets stay
// global ids; V the global real vocabulary. No M×V logits exist anywhere.
struct VocabShard {
  int v0 = 0;
  std::function<void(float* lse, float* target_logit, int rows)> combine;
};

// losses (M) fp32: -log softmax(x·wteᵀ)[target]  (0 where the target is negative).
template <typename T>
void ClassifierForward(float* losses, const T* x, const T* wte, const int32_t* targets, int M,
                       int C, int V, int Vp, const VocabShard* shard = nullptr);

// As ClassifierForward, and the backward of Σ_rows dloss·loss_row:
// dx (M,C) overwritten; dwte (Vp,C) fp32 += .
template <typename T>
void ClassifierForwardBackward(float* losses, T* dx, float* dwte, const T* x, const T* wte,
                               const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                               const VocabShard* shard = nullptr);

// logits (M, V) fp32 for sampling: x·wteᵀ over the real vocabulary.
template <typename T>
void ClassifierLogits(float* logits, const T* x, const T* wte, int M, int C, int V);

}  // namespace keel::kernels

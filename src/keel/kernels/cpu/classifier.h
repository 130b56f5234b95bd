// The final projection onto the (tied) token embedding fused with softmax cross-entropy, computed
// in vocabulary chunks: only an M×chunk tile of logits exists at a time, never a second M×V
// buffer. Backward recomputes each chunk from the saved per-row log-sum-exp.
//
// Legend: M rows (B*T), C channels, V real vocabulary, Vp padded vocabulary (rows of wte, a
// multiple of 128). Logits of the padded ids [V, Vp) are masked out of the softmax.
// targets (M) int32; a negative target means "no loss at this row".
#pragma once

#include <cstdint>

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"
#include "keel/kernels/op_args.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

// losses (M) fp32: -log softmax(x·wteᵀ)[target]  (0 where the target is negative).
template <typename T>
void ClassifierForward(float* losses, const T* x, const T* wte, const int32_t* targets, int M,
                       int C, int V, int Vp, const VocabShard* shard = nullptr);

// As ClassifierForward, and the backward of Σ_rows dloss·loss_row:
// dx (M,C) overwritten; dwte (Vp,C) fp32 += (null: a frozen classifier, the product skipped).
template <typename T>
void ClassifierForwardBackward(float* losses, T* dx, float* dwte, const T* x, const T* wte,
                               const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                               const VocabShard* shard = nullptr);

// logits (M, V) fp32 for sampling: x·wteᵀ over the real vocabulary.
template <typename T>
void ClassifierLogits(float* logits, const T* x, const T* wte, int M, int C, int V);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

// AdamW (Loshchilov & Hutter): decoupled weight decay, bias correction, on fp32 master weights.
//
// For each i: g = grad[i]·grad_scale; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// m̂ = m/(1-β1^t); v̂ = v/(1-β2^t); master -= lr·(m̂/(√v̂ + eps) + weight_decay·master).
// `step` t counts from 1. If `working` is non-null (bf16 runs) the updated master is rounded into
// it (round-to-nearest-even). bf16 moments and master-less weights: AdamWState.
#pragma once

#include <cstddef>

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"
#include "keel/kernels/op_args.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

// The general form (op_args.h's AdamWState: bf16 moments, master-less bf16 weights); the two
// below are its fp32-moment cases.
void AdamWUpdate(const AdamWState& s, size_t n, const AdamWParams& p);
void AdamWUpdate(float* master, float* m, float* v, const float* grad, size_t n,
                 const AdamWParams& p);
void AdamWUpdate(float* master, bf16* working, float* m, float* v, const float* grad, size_t n,
                 const AdamWParams& p);

// Σ x² in fp64, over fixed blocks of 2^16 added in order: the same value for any thread count.
double SumSquares(const float* x, size_t n);
double SumSquares(const bf16* x, size_t n);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

// LayerNorm over the last axis, statistics in fp32.
//
// Legend: N rows (B*T), C channels.
// Forward saves the per-row mean and reciprocal standard deviation (fp32) for backward.
// Backward *adds* into dweight/dbias (fp32) and — unlike other kernels — also *adds* into dinp:
// a LayerNorm's input is always the residual stream, whose gradient already holds the skip-path
// term, and adding in place saves a pass over B*T*C.
#pragma once

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void LayerNormForward(T* out, float* mean, float* rstd, const T* inp, const T* weight,
                      const T* bias, int N, int C);

template <typename T>
void LayerNormBackward(T* dinp, float* dweight, float* dbias, const T* dout, const T* inp,
                       const T* weight, const float* mean, const float* rstd, int N, int C);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

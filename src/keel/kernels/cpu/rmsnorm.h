// RMSNorm over the last axis (Llama's normalization), statistics in fp32:
//   out = x · rstd · weight,  rstd = 1 / √(mean(x²) + eps)
//
// Legend: N rows (B*T), C channels.
// Forward saves the per-row rstd (fp32) for backward. Backward follows LayerNorm's contract: it
// *adds* into dweight (fp32) and into dinp (the residual stream's gradient already holds the skip
// path's term).
#pragma once

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void RmsNormForward(T* out, float* rstd, const T* inp, const T* weight, int N, int C, float eps);

template <typename T>
void RmsNormBackward(T* dinp, float* dweight, const T* dout, const T* inp, const T* weight,
                     const float* rstd, int N, int C);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

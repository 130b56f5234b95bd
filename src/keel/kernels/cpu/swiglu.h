// SwiGLU (Shazeer 2020), Llama's MLP activation: out = silu(gate) · up, silu(g) = g·σ(g).
//
// Legend: N rows (B*T), F hidden units.
// gate_up (N, 2F): each row's F gate values, then its F up values (one product computes both).
// out (N, F). Backward overwrites dgate_up (N, 2F) in the same layout.
#pragma once

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void SwigluForward(T* out, const T* gate_up, int N, int F);

template <typename T>
void SwigluBackward(T* dgate_up, const T* gate_up, const T* dout, int N, int F);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

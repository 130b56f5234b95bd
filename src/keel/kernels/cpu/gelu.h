// GELU, tanh approximation (as GPT-2): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
// Backward overwrites dinp.
#pragma once

#include <cstddef>

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void GeluForward(T* out, const T* inp, size_t n);

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

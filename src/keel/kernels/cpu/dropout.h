// LoRA dropout's mask applied to a matrix, forward or accumulated backward (contract:
// Backend::Dropout; the mask: op_args.h's DropoutMask).
#pragma once

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"
#include "keel/kernels/op_args.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void Dropout(T* out, const T* x, int rows, int cols, const DropoutMask& m, bool accumulate);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

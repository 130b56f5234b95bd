// A quantized matrix (or a run of its rows) into the working dtype, before the product that reads
// it: the frozen base of a QLoRA run (model/quantize.h). The contract is Backend::Dequantize's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"
#include "keel/kernels/op_args.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void Dequantize(T* out, const uint8_t* codes, const float* scales, size_t n, size_t group,
                QuantFormat f);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

// fp8 emulation (core/fp8.h) on the CPU: a tensor's largest magnitude, and the tensor as an fp8
// product sees it. The contracts are Backend::AbsMax's and Backend::Fp8Round's.
#pragma once

#include <cstddef>

#include "keel/core/dtype.h"
#include "keel/core/fp8.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
float AbsMax(const T* x, size_t n);

template <typename T>
void Fp8Round(T* out, const T* in, size_t n, float scale, Fp8Format f);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

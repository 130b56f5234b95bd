// DoRA's three small kernels around an adapted product (contracts: Backend::DoraNorm, DoraScale,
// DoraMagnitudeGrad).
#pragma once

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void DoraNorm(float* scale, float* inv_norm, const float* magnitude, const T* W, const T* A,
              const T* B, int out, int in, int r, float s);
template <typename T>
void DoraScale(T* out, const T* z, const float* scale, const float* bias, int rows, int cols,
               bool accumulate);
template <typename T>
void DoraMagnitudeGrad(float* dmag, const T* dy, const T* z, const float* inv_norm, int rows,
                       int cols);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

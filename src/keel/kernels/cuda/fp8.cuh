// fp8 emulation on the GPU (fp8.cu; contracts: Backend::AbsMax, Backend::Fp8Round). Internal to
// kernels/cuda/.
#pragma once

#include "keel/core/fp8.h"
#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

float AbsMax(DType t, const void* x, size_t n, cudaStream_t stream);
void Fp8Round(DType t, void* out, const void* in, size_t n, float scale, Fp8Format f,
              cudaStream_t stream);

}  // namespace keel::kernels::cuda

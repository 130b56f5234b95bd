// DoRA's kernels on the GPU (dora.cu; contracts: Backend::DoraNorm, DoraScale, DoraMagnitudeGrad).
// Internal to kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

void DoraNorm(DType t, float* scale, float* inv_norm, const float* magnitude, const void* W,
              const void* A, const void* B, int out, int in, int r, float s, cudaStream_t stream);
void DoraScale(DType t, void* out, const void* z, const float* scale, const float* bias, int rows,
               int cols, bool accumulate, cudaStream_t stream);
void DoraMagnitudeGrad(DType t, float* dmag, const void* dy, const void* z, const float* inv_norm,
                       int rows, int cols, cudaStream_t stream);

}  // namespace keel::kernels::cuda

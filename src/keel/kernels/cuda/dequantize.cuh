// Dequantization on the GPU (dequantize.cu; contract: Backend::Dequantize). Internal to
// kernels/cuda/.
#pragma once

#include <cstdint>

#include "keel/kernels/cuda/cuda_util.cuh"
#include "keel/kernels/op_args.h"

namespace keel::kernels::cuda {

void Dequantize(DType t, void* out, const uint8_t* codes, const float* scales, size_t n,
                size_t group, QuantFormat f, cudaStream_t stream);

}  // namespace keel::kernels::cuda

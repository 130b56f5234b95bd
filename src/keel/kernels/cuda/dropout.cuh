// LoRA dropout on the GPU (dropout.cu; contract: Backend::Dropout). Internal to kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"
#include "keel/kernels/op_args.h"

namespace keel::kernels::cuda {

void Dropout(DType t, void* out, const void* x, int rows, int cols, const DropoutMask& m,
             bool accumulate, cudaStream_t stream);

}  // namespace keel::kernels::cuda

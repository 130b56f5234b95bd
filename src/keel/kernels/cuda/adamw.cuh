// AdamW on the GPU (adamw.cu; contract: cpu/adamw.h), with the update's other elementwise work,
// which has no op file of its own on either backend: Σ x² for the gradient norm, the rounding of
// fp32 into bf16, and dst += src (a reduce-scattered gradient into the shard). Internal to
// kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"
#include "keel/kernels/op_args.h"

namespace keel::kernels::cuda {

// Over what `s` names (op_args.h's AdamWState).
void AdamW(const AdamWState& s, size_t n, const AdamWParams& p, cudaStream_t stream);
// Σ x² in fp64, in a fixed order; waits for the result.
double SumSquares(const float* x, size_t n, cudaStream_t stream);
void ToBf16(bf16* out, const float* in, size_t n, cudaStream_t stream);
void ToF32(float* out, const bf16* in, size_t n, cudaStream_t stream);
void AddTo(float* dst, const float* src, size_t n, cudaStream_t stream);

}  // namespace keel::kernels::cuda

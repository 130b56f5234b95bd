// The classifier fused with cross-entropy on the GPU (classifier.cu; contract: cpu/classifier.h),
// and the plain logits for inference. Internal to kernels/cuda/.
#pragma once

#include "keel/kernels/cuda/cuda_util.cuh"

namespace keel::kernels::cuda {

// dx null: forward only (losses); else also dx = ∂/∂x and dwte += ∂/∂wte.
void Classifier(DType t, float* losses, void* dx, float* dwte, const void* x, const void* wte,
                const int32_t* targets, float dloss, int M, int C, int V, int Vp,
                cudaStream_t stream);
void ClassifierLogits(DType t, float* logits, const void* x, const void* wte, int M, int C, int V,
                      cudaStream_t stream);

}  // namespace keel::kernels::cuda

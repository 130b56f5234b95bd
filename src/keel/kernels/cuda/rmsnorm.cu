// RMSNorm (contract: cpu/rmsnorm.h): LayerNorm's row kernels (layernorm.cu) without the mean.
#include "keel/kernels/cuda/layernorm.cuh"
#include "keel/kernels/cuda/rmsnorm.cuh"

namespace keel::kernels::cuda {

void RmsNormForward(DType t, void* out, float* rstd, const void* inp, const void* w, int N, int C,
                    float eps, cudaStream_t stream) {
  Norm(t, out, nullptr, rstd, inp, w, nullptr, N, C, /*rms=*/true, eps, stream);
}

void RmsNormBackward(DType t, void* dinp, float* dw, const void* dout, const void* inp,
                     const void* w, const float* rstd, int N, int C, cudaStream_t stream) {
  NormBackward(t, dinp, dw, nullptr, dout, inp, w, nullptr, rstd, N, C, stream);
}

}  // namespace keel::kernels::cuda

// The CUDA backend (built where cmake finds nvcc): device memory on this process's GPU, cuBLASLt
// matrix products, and keel's own kernels for the rest (cuda/*.cu, one file per operation as in
// cpu/). Every operation is issued on the backend's compute stream, which it passes to each
// launcher: the legacy default stream, so Memory's copies are ordered after the kernels before
// them.
#pragma once

#include "keel/kernels/backend.h"

namespace keel::kernels::cuda {

// Throws BadInput when no GPU is visible to this process. Reached from keel through the plugin
// entry point keel_cuda_backend() (kernels::Get).
const Backend& CudaBackend();

}  // namespace keel::kernels::cuda

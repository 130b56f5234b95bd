// LoRA dropout (contract: Backend::Dropout): one thread per element, the row's key recomputed by
// each (two 64-bit multiplies: cheaper than a pass to share it).
#include "keel/kernels/cuda/dropout.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

template <typename T>
__global__ void Apply(T* out, const T* x, int cols, size_t n, DropoutMask m, bool accumulate) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const size_t r = i / size_t(cols), c = i % size_t(cols);
  const bool keep =
      DropoutKeep(DropoutRowKey(m.key, m.row0 + r), m.col0 + uint32_t(c), m.threshold);
  // Unfused, as the CPU kernels: the same bits on every backend.
  const float v = keep ? __fmul_rn(Ld(x, i), m.scale) : 0.0f;
  St(out, i, accumulate ? __fadd_rn(Ld(out, i), v) : v);
}

}  // namespace

void Dropout(DType t, void* out, const void* x, int rows, int cols, const DropoutMask& m,
             bool accumulate, cudaStream_t stream) {
  const size_t n = size_t(rows) * size_t(cols);
  KEEL_TYPED_LAUNCH(t, n, kThreads,
                    (Apply<U><<<blocks, kThreads, 0, stream>>>(
                        static_cast<U*>(out), static_cast<const U*>(x), cols, n, m, accumulate)));
}

}  // namespace keel::kernels::cuda

// Dequantization (contract: Backend::Dequantize): one thread per output element.
#include "keel/kernels/cuda/dequantize.cuh"

namespace keel::kernels::cuda {
namespace {

constexpr unsigned kThreads = 256;

// NF4's table travels as a kernel argument (constant memory): a host constexpr array cannot be
// indexed at run time in device code.
struct Levels {
  float v[16];
};

template <typename T>
__global__ void Dequant(T* out, const uint8_t* codes, const float* scales, size_t n, size_t group,
                        bool nf4, Levels lv) {
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float s = scales[i / group];
  const float q =
      nf4 ? lv.v[(codes[i / 2] >> (4 * (i % 2))) & 15] : float(static_cast<int8_t>(codes[i]));
  St(out, i, s * q);
}

}  // namespace

void Dequantize(DType t, void* out, const uint8_t* codes, const float* scales, size_t n,
                size_t group, QuantFormat f, cudaStream_t stream) {
  Levels lv;
  for (int i = 0; i < 16; ++i) lv.v[i] = kNf4Levels[i];
  const bool nf4 = f == QuantFormat::kNf4;
  KEEL_TYPED_LAUNCH(t, n, kThreads,
                    (Dequant<U><<<blocks, kThreads, 0, stream>>>(static_cast<U*>(out), codes,
                                                                 scales, n, group, nf4, lv)));
}

}  // namespace keel::kernels::cuda

#include "keel/core/dtype.h"

namespace keel {

void ConvertF32ToBf16(bf16* out, const float* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = ToBf16(in[i]);
}

void ConvertBf16ToF32(float* out, const bf16* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = ToFloat(in[i]);
}

}  // namespace keel

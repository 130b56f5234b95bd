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

void ConvertF32ToF16(f16* out, const float* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = ToF16(in[i]);
}

void ConvertF16ToF32(float* out, const f16* in, size_t n) {
#pragma omp parallel for simd schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = ToFloat(in[i]);
}

void ConvertToF32(DType t, float* out, const void* in, size_t n) {
  if (t == DType::kF16) return ConvertF16ToF32(out, static_cast<const f16*>(in), n);
  ConvertBf16ToF32(out, static_cast<const bf16*>(in), n);
}

void ConvertFromF32(DType t, void* out, const float* in, size_t n) {
  if (t == DType::kF16) return ConvertF32ToF16(static_cast<f16*>(out), in, n);
  ConvertF32ToBf16(static_cast<bf16*>(out), in, n);
}

}  // namespace keel

// LoRA dropout (contract: dropout.h). A row at a time: its key once, then a hash, a compare and a
// select per element, which GCC vectorizes (32-bit multiplies); bandwidth-bound like a GELU pass.
#include "keel/kernels/cpu/dropout.h"

// This copy's ISA from here on (isa_begin.h).
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void Dropout(T* out, const T* x, int rows, int cols, const DropoutMask& m, bool accumulate) {
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const uint32_t key = DropoutRowKey(m.key, m.row0 + uint64_t(r));
    const T* xr = x + size_t(r) * size_t(cols);
    T* o = out + size_t(r) * size_t(cols);
    // Every load unconditional and the mask a select: a conditional load would be a masked one,
    // which GCC does not vectorize for these types.
    auto masked = [&](int c) {
      const float v = ToFloat(xr[c]) * m.scale;
      return DropoutKeep(key, m.col0 + uint32_t(c), m.threshold) ? v : 0.0f;
    };
    if (accumulate) {
#pragma omp simd
      for (int c = 0; c < cols; ++c) o[c] = FromFloat<T>(ToFloat(o[c]) + masked(c));
    } else {
#pragma omp simd
      for (int c = 0; c < cols; ++c) o[c] = FromFloat<T>(masked(c));
    }
  }
}

template void Dropout<float>(float*, const float*, int, int, const DropoutMask&, bool);
template void Dropout<bf16>(bf16*, const bf16*, int, int, const DropoutMask&, bool);
template void Dropout<f16>(f16*, const f16*, int, int, const DropoutMask&, bool);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

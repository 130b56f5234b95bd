// Dequantization; the contract is in dequantize.h. One pass over the codes, a group at a time so
// that the scale is a loop constant and the inner loop vectorizes (int8: a widening convert and a
// multiply; NF4: a 16-entry table lookup per nibble). Bandwidth-bound: a byte (NF4: half) read and
// 2 or 4 written per weight, against the 2·rows FLOPs per weight of the product that follows.
#include "keel/kernels/cpu/dequantize.h"

#include <algorithm>

// This copy's ISA from here on (isa_begin.h).
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void Dequantize(T* out, const uint8_t* codes, const float* scales, size_t n, size_t group,
                QuantFormat f) {
  const size_t groups = (n + group - 1) / group;
#pragma omp parallel for schedule(static)
  for (size_t g = 0; g < groups; ++g) {
    const size_t lo = g * group, hi = std::min(n, lo + group);
    const float s = scales[g];
    T* y = out + lo;
    if (f == QuantFormat::kInt8) {
      const auto* q = reinterpret_cast<const int8_t*>(codes) + lo;
#pragma omp simd
      for (size_t i = 0; i < hi - lo; ++i) y[i] = FromFloat<T>(s * float(q[i]));
    } else {
      // lo is even (groups of 64, or whole rows of an even width: dequantize.h).
      const uint8_t* q = codes + lo / 2;
      for (size_t i = 0; i < (hi - lo) / 2; ++i) {
        y[2 * i] = FromFloat<T>(s * kNf4Levels[q[i] & 15]);
        y[2 * i + 1] = FromFloat<T>(s * kNf4Levels[q[i] >> 4]);
      }
      if ((hi - lo) % 2) y[hi - lo - 1] = FromFloat<T>(s * kNf4Levels[q[(hi - lo) / 2] & 15]);
    }
  }
}

template void Dequantize<float>(float*, const uint8_t*, const float*, size_t, size_t, QuantFormat);
template void Dequantize<bf16>(bf16*, const uint8_t*, const float*, size_t, size_t, QuantFormat);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

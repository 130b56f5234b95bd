// Token + position embedding forward/backward; the contract is in encoder.h.
//
// Legend: B batch, T time, C channels, V (padded) vocabulary rows of wte, maxT rows of wpe.
//
// Backward scatters into dwte rows picked by the tokens, and a token may repeat, so threads cannot
// split the tokens without racing or reordering sums. They split the channels instead: each thread
// owns a fixed channel range and walks all B*T tokens in order, so every dwte/dwpe element receives
// its additions in (b, t) order whatever the thread count — bitwise deterministic.
#include "keel/kernels/cpu/encoder.h"

#include <omp.h>

#include <algorithm>
#include <cstddef>

// This copy's ISA from here on (isa_begin.h), and the kernel-private headers that need it.
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {
namespace {

// Channel ranges are cut at multiples of a cache line of fp32 (64 bytes), so that two threads never
// write to the same line of dwte/dwpe.
constexpr int kChannelAlign = 16;

}  // namespace

template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C,
                    int v0, int v1) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < B * T_; ++bt) {
    const int tok = tokens[bt];
    const T* te = tok >= v0 && tok < v1 ? wte + size_t(tok - v0) * C : nullptr;
    const T* pe = wpe ? wpe + size_t(bt % T_) * C : nullptr;
    T* o = out + size_t(bt) * C;
    if (te && pe) {
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = FromFloat<T>(ToFloat(te[c]) + ToFloat(pe[c]));
    } else if (te || pe) {
      std::copy(te ? te : pe, (te ? te : pe) + C, o);
    } else {
      std::fill(o, o + C, FromFloat<T>(0.0f));
    }
  }
}

template <typename T>
void EncoderBackward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B, int T_,
                     int C, int v0, int v1) {
#pragma omp parallel
  {
    const int threads = omp_get_num_threads();
    const int chunks = (C + kChannelAlign - 1) / kChannelAlign;
    const int thread = omp_get_thread_num();
    const int c_begin = std::min(C, chunks * thread / threads * kChannelAlign);
    const int c_end = std::min(C, chunks * (thread + 1) / threads * kChannelAlign);
    for (int bt = 0; bt < B * T_; ++bt) {
      const T* g = dout + size_t(bt) * C;
      const int tok = tokens[bt];
      if (dwpe) {
        float* dpe = dwpe + size_t(bt % T_) * C;
#pragma omp simd
        for (int c = c_begin; c < c_end; ++c) dpe[c] += ToFloat(g[c]);
      }
      if (tok < v0 || tok >= v1) continue;
      float* dte = dwte + size_t(tok - v0) * C;
#pragma omp simd
      for (int c = c_begin; c < c_end; ++c) dte[c] += ToFloat(g[c]);
    }
  }
}

template void EncoderForward<float>(float*, const int32_t*, const float*, const float*, int, int,
                                    int, int, int);
template void EncoderForward<bf16>(bf16*, const int32_t*, const bf16*, const bf16*, int, int, int,
                                   int, int);
template void EncoderForward<f16>(f16*, const int32_t*, const f16*, const f16*, int, int, int, int,
                                  int);
template void EncoderBackward<float>(float*, float*, const float*, const int32_t*, int, int, int,
                                     int, int);
template void EncoderBackward<bf16>(float*, float*, const bf16*, const int32_t*, int, int, int, int,
                                    int);
template void EncoderBackward<f16>(float*, float*, const f16*, const int32_t*, int, int, int, int,
                                   int);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

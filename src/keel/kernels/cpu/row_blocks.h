// Deterministic sums over rows for the normalizations' weight gradients (LayerNorm, RMSNorm).
//
// Rows are cut into blocks whose count depends on N only — never on the thread count — each block
// sums into its own fp32 partial, and the partials are then added in block order. The result is
// bitwise the same on every call and for any number of threads, at the cost of one small extra
// pass.
#pragma once

#include <algorithm>
#include <cstddef>

#include "keel/kernels/cpu/isa.h"
#include "keel/kernels/cpu/scratch.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS::internal {

// More row blocks allow more threads but lengthen the final reduction (blocks·width floats). 32
// blocks keep 16 cores busy; at least 8 rows per block keep the partials under ~1/8 of the main
// pass's traffic.
inline int RowBlocks(int N) {
  constexpr int kMaxRowBlocks = 32, kMinRowsPerBlock = 8;
  return std::clamp((N + kMinRowsPerBlock - 1) / kMinRowsPerBlock, 1, kMaxRowBlocks);
}

// Scratch owned by the calling thread, grown on demand and kept, so that steady-state training
// allocates nothing. thread_local (not a plain static) keeps two concurrent callers apart.
inline float* PartialScratch(size_t n) {
  thread_local AlignedScratch<float> buffer;
  return buffer.Get(n);
}

// out[c] += Σ_k partial[k·width + c] over `blocks` partials, in block order. Channels are
// independent, so threads split them; every loop has the same `width` iterations and the same
// static schedule, so each thread owns the same floats throughout (OpenMP guarantees that
// assignment) and `nowait` is safe. `out(c)` returns the destination of channel c.
template <typename Out>
void AddPartials(float* partial, int blocks, int width, Out out) {
#pragma omp parallel
  {
    for (int k = 1; k < blocks; ++k) {
      const float* pk = partial + size_t(k) * width;
#pragma omp for simd schedule(static) nowait
      for (int c = 0; c < width; ++c) partial[c] += pk[c];
    }
#pragma omp for simd schedule(static)
    for (int c = 0; c < width; ++c) out(c) += partial[c];
  }
}

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS::internal

// Scratch that only grows, 64-byte aligned, so that steady-state training steps allocate nothing.
//
// Why not std::vector: a large vector's data sits 16 bytes past a page boundary (malloc's header),
// so every row of a GEMM operand straddles cache lines, and oneDNN 2.6's AMX brgemm then runs the
// classifier's logits product at half speed (512×256 · 256×50304 bf16: 80 → 39 ms on a Xeon with
// AMX).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

#include "keel/core/memory.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
class AlignedScratch {
 public:
  // At least n elements, 64-byte aligned; what it held before is not kept when it grows.
  // Each buffer starts 64·(1..32) bytes past its block's start, a different amount from the last
  // one made: blocks from 2 MiB up start on a huge page, where virtual and physical addresses
  // agree in their low 21 bits, so a product's A, B and C scratch would otherwise share L2 sets
  // row for row (bf16 products widened to fp32 on AVX2: the quickstart classifier 1,000 -> 945
  // ms).
  T* Get(size_t n) {
    if (n > capacity_) {
      static std::atomic<size_t> count{0};
      offset_ = 64 * (1 + count.fetch_add(1) % 32) / sizeof(T);
      data_.reset(static_cast<T*>(AllocHostAligned((n + offset_) * sizeof(T))));
      capacity_ = n;
    }
    return data_.get() + offset_;
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> data_;
  size_t capacity_ = 0, offset_ = 0;
};

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

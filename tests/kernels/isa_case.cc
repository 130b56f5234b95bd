// GCC 12.2's wide-constant miscompile, reduced (CMakeLists.txt's -mmove-max=128): compiled under
// the AVX-512 kernels' #pragma (built with KEEL_ISA_AVX512), as a kernel would be. Without the
// flags GCC 12.2 emits `vpbroadcastq .LC1(%rip), %ymm0; vmovdqu %ymm0, (%rdi)` for it: {1, 1, 1,
// 1}.
#include "keel/kernels/cpu/isa_begin.h"

namespace keel::test {

__attribute__((noinline)) void StoreOneOneZeroZero(uint64_t* p) {
  const uint64_t init[4] = {1, 1, 0, 0};
  std::memcpy(p, init, sizeof init);
}

}  // namespace keel::test

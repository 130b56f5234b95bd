// Included by each kernels/cpu/*.cc after its own includes and before the code it defines: from
// here to the end of the file, functions are compiled for the ISA isa.h names.
//
// A #pragma and not -mavx512f on the command line, because only what follows it changes: the
// standard library's and keel/core's inline functions and templates above stay baseline code, so
// the linker, which keeps one copy of each, can never keep an AVX-512 one that baseline code then
// calls on a CPU without AVX-512 (tests/kernels/isa_leak_check.sh checks the linked binary). The
// headers used below the pragma (vec_math.h, row_blocks.h, attention_tiles.h) include nothing that
// is not included here first.
//
// No include guard: each .cc includes it once.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "keel/core/memory.h"  // scratch.h's, which row_blocks.h includes
#include "keel/kernels/cpu/isa.h"

#if defined(__GNUC__) && !defined(__clang__)
#if defined(KEEL_ISA_AVX512)
// x86-64-v4's set. 512-bit vectors for loops GCC vectorizes itself: its Intel tunings prefer 256.
#pragma GCC target( \
    "avx512f,avx512bw,avx512dq,avx512vl,avx512cd,avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt,prefer-vector-width=512")
#elif defined(KEEL_ISA_AVX2)
// x86-64-v3's set.
#pragma GCC target("avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt")
#endif
#elif defined(KEEL_ISA_AVX2) || defined(KEEL_ISA_AVX512)
#error \
    "per-ISA kernels need GCC's #pragma GCC target (CMakeLists.txt builds only the baseline set with other compilers)"
#endif

#define KEEL_ISA_REGION 1

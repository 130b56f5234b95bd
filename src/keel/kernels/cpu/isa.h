// The instruction set the CPU kernels of this translation unit are built for.
//
// CMake compiles every kernels/cpu/*.cc once per ISA (targets keel_kernels_<isa>), defining
// KEEL_ISA_AVX2 or KEEL_ISA_AVX512 for the wider ones; each copy lives in its own inline namespace,
// so the three sets link side by side and kernels/cpu_isa.cc picks one at start from what the CPU
// reports. A file that includes a kernel header without either macro (the baseline build, the
// tests) names the x86-64-v2 copy; tests/kernels builds its tests once per ISA to reach the others.
#pragma once

#if defined(KEEL_ISA_AVX512)
#define KEEL_ISA_NS isa_avx512
#elif defined(KEEL_ISA_AVX2)
#define KEEL_ISA_NS isa_avx2
#else
#define KEEL_ISA_NS isa_sse42
#endif

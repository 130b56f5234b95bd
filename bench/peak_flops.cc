// The machine's peak arithmetic rate, measured: a tight loop of independent AVX-512 FMAs
// (vfmadd231ps, 32 FLOP each), one of vdpbf16ps (64 FLOP each) and, where the CPU has AMX, one of
// tdpbf16ps (16384 FLOP each), on 1 thread and on N threads at once (default 2), each thread's
// rate taken over its own CPU time (robust to other load, exact on a quiet machine). MFU in
// bench/train_throughput.sh is taken against these figures. The loops live in
// keel/core/cpu_rates.cc, shared with the kernels (how bf16 products run), `keel plan --accelerator
// this-cpu` and preflight.
//
//   build/peak_flops [threads=2] [seconds_per_run=0.3]
// prints one JSON line: fp32_fma_gflops, bf16_dpbf16_gflops, amx_bf16_gflops (0 without AMX), the
// same on one core (*_1core), threads.
#include <cstdio>
#include <cstdlib>

#include "keel/core/cpu_rates.h"

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 0.3;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) {
    std::fprintf(stderr, "peak_flops: needs AVX-512F and AVX512-BF16\n");
    return 1;
  }
  using keel::MeasurePeakRates;
  const auto one = MeasurePeakRates(1, seconds, 3), all = MeasurePeakRates(threads, seconds, 3);
  std::printf(
      "{\"threads\": %d, \"fp32_fma_gflops\": %.1f, \"bf16_dpbf16_gflops\": %.1f, "
      "\"amx_bf16_gflops\": %.1f, \"fp32_fma_gflops_1core\": %.1f, "
      "\"bf16_dpbf16_gflops_1core\": %.1f, \"amx_bf16_gflops_1core\": %.1f, "
      "\"method\": \"best of 3 x %.2fs per figure; 16 independent zmm vfmadd231ps / vdpbf16ps "
      "chains, 4 independent tdpbf16ps tiles, per thread; FLOPs per thread CPU second, summed\"}\n",
      threads, all.fp32_fma / 1e9, all.bf16_dpbf16 / 1e9, all.amx_bf16 / 1e9, one.fp32_fma / 1e9,
      one.bf16_dpbf16 / 1e9, one.amx_bf16 / 1e9, seconds);
  return 0;
}

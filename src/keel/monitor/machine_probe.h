// This machine, measured: the peak arithmetic rates of its CPUs (tight loops of independent
// AVX-512 FMAs, or AVX2 FMAs where the CPU has no AVX-512; vdpbf16ps and, where the CPU has it,
// AMX tdpbf16ps), its memory copy rate and its memory size. bench/peak_flops prints the rates;
// `keel plan --accelerator this-cpu` and `keel preflight` use all of them.
//
//   auto rates = keel::monitor::MeasurePeakRates(/*threads=*/2, /*seconds=*/0.3, /*reps=*/3);
//   rates.bf16();  // FLOP/s of the fastest bf16 path (AMX where it exists)
#pragma once

#include <cstddef>

namespace keel::monitor {

// FLOP/s summed over threads, each thread's rate over its own CPU time (robust to other load,
// exact on a quiet machine). A path the CPU lacks reads 0.
struct PeakRates {
  double fp32_fma = 0;  // vfmadd231ps zmm: 32 FLOP each (ymm without AVX-512: 16 FLOP each)
  // vfmadd231ps ymm: the rate of code held to AVX2 (fp32_fma itself without AVX-512).
  double fp32_fma256 = 0;
  double bf16_dpbf16 = 0;  // vdpbf16ps zmm: 64 FLOP each
  double amx_bf16 = 0;     // tdpbf16ps: 16·16·32·2 FLOP each
  int fma_bits = 0;        // the register width fp32_fma was measured on: 512, 256, or 0 (none)
  // The fastest bf16 path; 0 on CPUs with no bf16 instructions (keel's bf16 products run in fp32
  // there, at the fp32 rate).
  double bf16() const { return amx_bf16 > bf16_dpbf16 ? amx_bf16 : bf16_dpbf16; }
};

// Best of `reps` runs of each loop on `threads` threads at once, each run `seconds` long.
PeakRates MeasurePeakRates(int threads, double seconds, int reps);

// Bytes memcpy moves per second (each byte read once and written once), `threads` threads each
// copying its share of a `bytes` buffer, best of `reps`.
double MeasureCopyRate(int threads, size_t bytes, int reps);

// MemTotal from /proc/meminfo, in bytes; 0 if it cannot be read (MemAvailable: core/validate.h).
double MemTotalBytes();

}  // namespace keel::monitor

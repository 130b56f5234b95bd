// This CPU's arithmetic rates, measured: tight loops of independent AVX-512 FMAs (AVX2 FMAs where
// the CPU has no AVX-512), of vdpbf16ps and, where the CPU has it, of AMX tdpbf16ps. MFU's peak
// (monitor/flops.h), `keel plan --accelerator this-cpu` and the kernels' choice of how bf16
// products run (kernels/cpu_isa.h) all read them; bench/peak_flops prints them.
//
//   auto rates = keel::MeasurePeakRates(/*threads=*/2, /*seconds=*/0.3, /*reps=*/3);
//   rates.bf16();  // FLOP/s of the fastest bf16 instruction (AMX where it exists)
#pragma once

namespace keel {

// FLOP/s summed over threads, each thread's rate over its own CPU time (robust to other load,
// exact on a quiet machine). A path the CPU lacks reads 0.
struct PeakRates {
  double fp32_fma = 0;  // vfmadd231ps zmm: 32 FLOP each (ymm without AVX-512: 16 FLOP each)
  // vfmadd231ps ymm: the rate of code held to AVX2 (fp32_fma itself without AVX-512).
  double fp32_fma256 = 0;
  double bf16_dpbf16 = 0;  // vdpbf16ps zmm: 64 FLOP each
  double amx_bf16 = 0;     // tdpbf16ps: 16·16·32·2 FLOP each
  int fma_bits = 0;        // the register width fp32_fma was measured on: 512, 256, or 0 (none)
  // The fastest bf16 instruction; 0 on CPUs with none.
  double bf16() const { return amx_bf16 > bf16_dpbf16 ? amx_bf16 : bf16_dpbf16; }
  // Whether keel's bf16 products run in fp32 on widened copies here (kernels/cpu_isa.h): no bf16
  // instruction, or one slower than the FMA, as vdpbf16ps at half the FMA rate on Xeons whose AMX
  // is hidden.
  bool bf16_in_fp32() const { return bf16() < fp32_fma; }
  // The rate keel's bf16 products can reach: the bf16 instruction's, or the FMA's where they run
  // in fp32.
  double bf16_products() const { return bf16_in_fp32() ? fp32_fma : bf16(); }
};

// Best of `reps` runs of each loop on `threads` threads at once, each run `seconds` long.
PeakRates MeasurePeakRates(int threads, double seconds, int reps);

}  // namespace keel

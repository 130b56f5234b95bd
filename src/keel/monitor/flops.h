// Model FLOPs and utilization (MFU), counted as PaLM's appendix B does: 6 FLOPs per parameter per
// token for forward and backward, plus 12·L·C·T per token for the attention scores and their
// products with V (T the sequence length). Parameters exclude the position embedding, a lookup;
// the tied token embedding counts, since it is also the classifier's matrix product.
//
//   double f = TrainFlopsPerToken(/*n_params=*/124e6, L, C, T);
//   double mfu = f * tokens_per_s / PeakFlops(DType::kBF16, threads);
#pragma once

#include <cstdint>

#include "keel/core/dtype.h"

namespace keel::monitor {

double TrainFlopsPerToken(double matmul_params, int n_layer, int n_embd, int seq_len);

// The peak arithmetic rate of `cores` cores of this CPU for matrix products in `dtype`, as
// measured by build/peak_flops (bench/peak_flops.cc) on the reference machines, per core:
//   fp32, AVX-512 FMA:            220 GFLOP/s
//   bf16 with AMX (tdpbf16ps):   3040 GFLOP/s   (oneDNN uses AMX for bf16 where it exists)
//   bf16 without AMX:            twice the fp32 figure (vdpbf16ps on CPUs that run it at full rate)
// `override_gflops` > 0 ([monitor] peak_gflops, for all cores of one rank) wins.
double PeakFlops(DType dtype, int cores, double override_gflops = 0);

// Whether this CPU has AMX tiles with bf16 (cpuid leaf 7: AMX-BF16).
bool CpuHasAmxBf16();

}  // namespace keel::monitor

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

// The peak this machine's cores reach in fp32 FMA or bf16 dot products, per core, times `cores`.
// Measured on the reference machine (AMD Zen 5, AVX-512): 242.5 GFLOP/s fp32 and 480 GFLOP/s bf16
// per core (two cores: ~485 and ~960, a tight FMA / vdpbf16ps loop). `override_gflops` > 0 wins.
double PeakFlops(DType dtype, int cores, double override_gflops = 0);

}  // namespace keel::monitor

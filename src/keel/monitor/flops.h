// Model FLOPs and utilization (MFU), counted as PaLM's appendix B does: 6 FLOPs per parameter per
// token for forward and backward, plus 12·L·C·T per token for the attention scores and their
// products with V (T the sequence length). Parameters exclude the position embedding, a lookup;
// the tied token embedding counts, since it is also the classifier's matrix product.
//
//   double f = TrainFlopsPerToken(/*n_params=*/124e6, L, C, T);
//   double mfu = f * tokens_per_s / MachinePeak(DType::kBF16, threads).flops;
#pragma once

#include <cstdint>
#include <string>

#include "keel/core/dtype.h"

namespace keel::monitor {

double TrainFlopsPerToken(double matmul_params, int n_layer, int n_embd, int seq_len);

// The peak arithmetic rate of this rank's `threads` threads for matrix products in `dtype`, and
// where it came from, for the log. Measured on this CPU (monitor/machine_probe.h: about a second)
// the first time and cached per CPU model and thread count in KEEL_CACHE_DIR, else
// $XDG_CACHE_HOME/keel, else ~/.cache/keel (peak_flops.json). bf16 takes the fastest bf16 path the
// CPU has (AMX tiles, else vdpbf16ps), or the fp32 rate where it has none: keel's bf16 products
// run in fp32 there. `override_gflops` > 0 ([monitor] peak_gflops, all threads of the rank) wins.
//
// `scope` kAvx2 is the peak of a run whose products are held to AVX2 (keel's kernels chosen avx2
// and oneDNN limited by ONEDNN_MAX_CPU_ISA=AVX2): 256-bit FMAs, for every dtype. Against the AMX
// peak such a run's MFU would measure the host's AMX rate (1.9-7.4 TFLOP/s on 2-vCPU Xeons of
// one model), not the AVX2 code.
enum class PeakScope { kCpu, kAvx2 };
struct Peak {
  double flops = 0;
  std::string source;  // "measured on this CPU, cached in PATH", "[monitor] peak_gflops", ...
};
Peak MachinePeak(DType dtype, int threads, double override_gflops = 0,
                 PeakScope scope = PeakScope::kCpu);

}  // namespace keel::monitor

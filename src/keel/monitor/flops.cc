#include "keel/monitor/flops.h"

namespace keel::monitor {

double TrainFlopsPerToken(double matmul_params, int n_layer, int n_embd, int seq_len) {
  return 6.0 * matmul_params + 12.0 * n_layer * n_embd * double(seq_len);
}

double PeakFlops(DType dtype, int cores, double override_gflops) {
  if (override_gflops > 0) return override_gflops * 1e9;
  const double per_core = dtype == DType::kF32 ? 242.5e9 : 480e9;
  return per_core * cores;
}

}  // namespace keel::monitor

#include "keel/monitor/flops.h"

#include <cpuid.h>

namespace keel::monitor {

double TrainFlopsPerToken(double matmul_params, int n_layer, int n_embd, int seq_len) {
  return 6.0 * matmul_params + 12.0 * n_layer * n_embd * double(seq_len);
}

bool CpuHasAmxBf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 22) & 1;  // EDX bit 22: AMX-BF16
}

double PeakFlops(DType dtype, int cores, double override_gflops) {
  if (override_gflops > 0) return override_gflops * 1e9;
  constexpr double kFp32PerCore = 220e9, kAmxBf16PerCore = 3040e9;
  if (dtype == DType::kF32) return kFp32PerCore * cores;
  return (CpuHasAmxBf16() ? kAmxBf16PerCore : 2 * kFp32PerCore) * cores;
}

}  // namespace keel::monitor

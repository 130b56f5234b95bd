// LoRA dropout's mask (Backend::Dropout, bf16) on one adapted product's input, beside what bounds
// it and what it serves, in one invocation:
//   - its time against its memory roofline: x read and the masked copy written (2 + 2 bytes an
//     element; the backward's accumulating form reads the gradient too: 6) at twice the measured
//     memcpy rate (bench/roofline.h's convention);
//   - its time against the adapter's own forward products, x·Aᵀ (rank r) and h·Bᵀ into the
//     output: dropout adds one such pass in forward and two in backward.
//
//   build/lora_dropout_bench [ROWS] [IN] [OUT] [RANK] [REPS]   # default 2048 4096 4096 16 5
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "best_ms.h"
#include "keel/kernels/backend.h"
#include "keel/monitor/machine_probe.h"

using namespace keel;
using keel::bench::BestMs;

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int in = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int out = argc > 3 ? std::atoi(argv[3]) : 4096;
  const int r = argc > 4 ? std::atoi(argv[4]) : 16;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 5;
  const kernels::Backend& be = kernels::Cpu();
  const size_t n = size_t(rows) * size_t(in);
  std::vector<bf16> x(n, ToBf16(0.5f)), xd(n), dx(n, ToBf16(0.25f));
  std::vector<bf16> A(size_t(r) * in, ToBf16(0.01f)), B(size_t(out) * r, ToBf16(0.01f));
  std::vector<bf16> h(size_t(rows) * r), y(size_t(rows) * out);
  const double bandwidth =
      2 * monitor::MeasureCopyRate(omp_get_max_threads(), size_t(192) << 20, 5);
  std::printf(
      "input %d x %d, output %d, rank %d, bf16, %d threads, memory %.1f GB/s (2 x memcpy)\n", rows,
      in, out, r, omp_get_max_threads(), bandwidth / 1e9);
  const kernels::DropoutMask m{42, 0, 0, 429496730u, float(1.0 / 0.9)};  // p = 0.1
  const double fwd = BestMs(reps, [&] { be.Dropout(xd.data(), x.data(), rows, in, m, false); });
  const double acc = BestMs(reps, [&] { be.Dropout(dx.data(), xd.data(), rows, in, m, true); });
  const double lora = BestMs(reps, [&] {
    be.MatmulForward(h.data(), x.data(), A.data(), nullptr, rows, in, r);
    be.MatmulForward(y.data(), h.data(), B.data(), nullptr, rows, r, out, true, 2.0f);
  });
  for (auto [name, ms, bytes] : {std::tuple{"mask (forward)", fwd, 4.0 * double(n)},
                                 std::tuple{"mask, accumulated (backward)", acc, 6.0 * double(n)}})
    std::printf("%-30s %7.2f ms, %5.1f GB/s, %3.0f%% of its memory roofline (%.2f ms)\n", name, ms,
                bytes / ms / 1e6, 100 * 1e3 * bytes / bandwidth / ms, 1e3 * bytes / bandwidth);
  std::printf("the adapter's forward products   %7.2f ms: the forward mask adds %.0f%% to them\n",
              lora, 100 * fwd / lora);
  return 0;
}

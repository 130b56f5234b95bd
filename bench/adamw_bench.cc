// The optimizer update in each state tier (optim.state_dtype, optim.master_weights) on N
// parameters, in one invocation:
//   - its time against its memory roofline: the bytes the tier must read and write per parameter
//     (gradient 4; fp32 moments 2 x (4 + 4), bf16 2 x (2 + 2); master 4 + 4 and the bf16 copy
//     written 2, or without a master the bf16 weights 2 + 2) at twice the measured memcpy rate
//     (bench/roofline.h's convention);
//   - its time against the fp32 tier's: what stochastic rounding's draws cost beside the bytes
//     saved. bench/adamw_bench.sh runs PyTorch's AdamW on the same N beside it.
//
//   build/adamw_bench [N] [REPS]   # default 33554432 (32 Mi) 5
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "best_ms.h"
#include "keel/kernels/backend.h"
#include "keel/monitor/machine_probe.h"

using namespace keel;
using keel::bench::BestMs;

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? size_t(std::atoll(argv[1])) : size_t(32) << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const kernels::Backend& be = kernels::Cpu();
  const double bandwidth =
      2 * monitor::MeasureCopyRate(omp_get_max_threads(), size_t(192) << 20, 5);
  std::printf("AdamW on %zu parameters (bf16 run), %d threads, memory %.1f GB/s (2 x memcpy)\n", n,
              omp_get_max_threads(), bandwidth / 1e9);
  std::vector<float> grad(n, 1e-3f), master(n, 0.01f), m32(n, 0.0f), v32(n, 0.0f);
  std::vector<bf16> working(n, ToBf16(0.01f)), m16(n, ToBf16(0.0f)), v16(n, ToBf16(0.0f));
  struct Tier {
    const char* name;
    kernels::AdamWState s;
    double bytes;  // per parameter, read + written
  };
  const Tier tiers[] = {
      {"fp32 master, fp32 moments (18 B)",
       {master.data(), working.data(), m32.data(), v32.data(), false, grad.data()},
       4 + 16 + 8 + 2},
      {"fp32 master, bf16 moments (14 B)",
       {master.data(), working.data(), m16.data(), v16.data(), true, grad.data()},
       4 + 8 + 8 + 2},
      {"no master, fp32 moments (14 B)",
       {nullptr, working.data(), m32.data(), v32.data(), false, grad.data()},
       4 + 16 + 4},
      {"no master, bf16 moments (10 B)",
       {nullptr, working.data(), m16.data(), v16.data(), true, grad.data()},
       4 + 8 + 4},
  };
  kernels::AdamWParams p;
  p.lr = 1e-4f;
  p.weight_decay = 0.1f;
  double first = 0;
  for (const Tier& t : tiers) {
    const double ms = BestMs(reps, [&] {
      p.round_key += 1;
      be.AdamWUpdate(t.s, n, p);
    });
    if (first == 0) first = ms;
    const double roof = 1e3 * t.bytes * double(n) / bandwidth;
    std::printf(
        "%-34s %8.2f ms  %5.1f GB/s  %3.0f%% of its memory roofline (%.2f ms)  %.2fx the "
        "fp32 tier's time\n",
        t.name, ms, t.bytes * double(n) / ms / 1e6, 100 * roof / ms, roof, ms / first);
  }
  return 0;
}

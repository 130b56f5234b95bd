// keel's causal attention (kernels/cpu/attention.cc) alone, forward and backward, at GPT-2 124M's
// heads (C 768, 12 heads of 64) and several sequence lengths, against the measured fp32 peak of
// the vectors its chosen copy uses (the kernel computes in fp32 for either storage type; a copy
// held to AVX2 by KEEL_CPU_ISA=avx2 against 256-bit FMAs) on the causal FLOPs bench/roofline.h
// counts: 2·B·T²·C forward, 5·B·T²·C backward. bench/attention_bench.sh runs PyTorch's attention
// on the same shapes beside it.
//
//   build/attention_bench [T ...]   # default 256 1024 2048; B = max(1, 1024 / T); REPS=5
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "best_ms.h"
#include "keel/kernels/backend.h"
#include "keel/kernels/cpu_isa.h"
#include "keel/monitor/flops.h"

using namespace keel;
using keel::bench::BestMs;

namespace {

template <typename T>
void Run(const char* name, int B, int T_, int C, int NH, int reps, double peak) {
  const kernels::Backend& be = kernels::Cpu();
  const size_t BT = size_t(B) * T_;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> qkv(BT * 3 * C), out(BT * C), dout(BT * C), dqkv(BT * 3 * C);
  for (auto& x : qkv) x = FromFloat<T>(normal(rng));
  for (auto& x : dout) x = FromFloat<T>(normal(rng));
  std::vector<float> lse(size_t(B) * NH * T_);
  const double fwd =
      BestMs(reps, [&] { be.AttentionForward(out.data(), lse.data(), qkv.data(), B, T_, C, NH); });
  const double bwd = BestMs(reps, [&] {
    be.AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T_, C,
                         NH);
  });
  const double flops = double(B) * T_ * T_ * C;  // × 2 forward, × 5 backward
  std::printf(
      "%-5s B=%-2d T=%-5d forward %8.2f ms %5.1f%% of the peak   backward %8.2f ms %5.1f%%\n", name,
      B, T_, fwd, 100 * 2 * flops / (fwd * 1e-3) / peak, bwd,
      100 * 5 * flops / (bwd * 1e-3) / peak);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> lengths;
  for (int i = 1; i < argc; ++i) lengths.push_back(std::atoi(argv[i]));
  if (lengths.empty()) lengths = {256, 1024, 2048};
  const int reps = std::getenv("REPS") ? std::atoi(std::getenv("REPS")) : 5;
  const int threads = omp_get_max_threads();
  const kernels::CpuIsa isa = kernels::ChosenCpuIsa();
  const auto scope =
      isa == kernels::CpuIsa::kAvx512 ? monitor::PeakScope::kCpu : monitor::PeakScope::kAvx2;
  const double peak = monitor::MachinePeak(DType::kF32, threads, 0, scope).flops;
  std::printf(
      "keel attention (%s kernels), C=768 NH=12 hs=64, %d threads, fp32 peak %.0f GFLOP/s, best "
      "of %d\n",
      kernels::IsaName(isa), threads, peak / 1e9, reps);
  for (int T_ : lengths) {
    if (T_ <= 0) {
      std::fprintf(stderr, "attention_bench: sequence length '%d': expected a positive integer\n",
                   T_);
      return 2;
    }
    const int B = std::max(1, 1024 / T_);
    Run<float>("fp32", B, T_, 768, 12, reps, peak);
    Run<bf16>("bf16", B, T_, 768, 12, reps, peak);
  }
  return 0;
}

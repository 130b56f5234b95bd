// "this-cpu": the accelerator entry measured on the machine the test runs on. The figures must
// be positive and plausible for a CPU, and the measurement quick.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "keel/monitor/machine_probe.h"
#include "keel/plan/hardware.h"
#include "keel/plan/search.h"

namespace {

TEST(MachineProbe, PeakRatesArePositiveAndPlausiblePerThread) {
  __builtin_cpu_init();
  const auto r = keel::monitor::MeasurePeakRates(1, 0.05, 2);
  if (!__builtin_cpu_supports("avx512f")) {
    // The loops are AVX-512: without it nothing is measured, and callers refuse the zeros.
    EXPECT_EQ(r.fp32_fma, 0);
    EXPECT_EQ(r.bf16(), 0);
    return;
  }
  // One core: an AVX-512 FMA loop does 32 FLOP per instruction, so at 0.5-6 GHz with 1-2 FMA
  // ports that is 16..400 GFLOP/s; anything outside means the loop or the clock is wrong.
  EXPECT_GT(r.fp32_fma, 16e9);
  EXPECT_LT(r.fp32_fma, 400e9);
  // vdpbf16ps runs at half the FMA rate on some CPUs (Sapphire Rapids) and full on others.
  if (__builtin_cpu_supports("avx512bf16")) {
    EXPECT_GT(r.bf16_dpbf16, 0.25 * r.fp32_fma);
  }
  EXPECT_GE(r.bf16(), r.bf16_dpbf16);
}

TEST(MachineProbe, CopyRateAndMemoryArePlausible) {
  const double copy = keel::monitor::MeasureCopyRate(1, size_t(64) << 20, 2);
  EXPECT_GT(copy, 0.2e9);  // even a slow, shared VM copies more than 200 MB/s
  EXPECT_LT(copy, 2e12);
  const double mem = keel::monitor::MemTotalBytes();
  EXPECT_GT(mem, 256e6);
  EXPECT_LT(mem, 64e12);
}

TEST(ThisCpu, FiguresBecomeAnAccelerator) {
  keel::plan::CpuFigures f{2e12, 0.4e12, 32e9, 5e9};
  const auto a = keel::plan::ThisCpu(f);
  EXPECT_EQ(a.name, "this-cpu");
  EXPECT_EQ(keel::plan::PeakFlops(a, false), 2e12);
  EXPECT_EQ(keel::plan::PeakFlops(a, true), 0.4e12);
  EXPECT_EQ(a.hbm_bytes_per_s, 10e9);  // a copy reads and writes every byte
  EXPECT_EQ(a.host_bytes_per_s, 5e9);
}

// docs/PERFORMANCE.md, "Results (2026-11-30)": keel's measured tokens/s on the 2-core AMX VM,
// idle, with the peaks measured in the same invocation (fp32 FMA 431, AMX bf16 6151 GFLOP/s).
// The plan on this-cpu, at its default efficiencies, must predict each within 25% (the issue's
// bar). The 124M rows are where the default efficiencies come from; small6 is independent.
TEST(ThisCpu, PredictsKeelsRecordedStepTimesWithin25Percent) {
  struct Recorded {
    const char* name;
    int layers, hidden, heads, seq, batch;
    keel::plan::Precision precision;
    double tokens_per_s;
  };
  using keel::plan::Precision;
  const Recorded runs[] = {
      {"124M fp32", 12, 768, 12, 256, 4, Precision::kFp32, 279},
      {"124M bf16", 12, 768, 12, 256, 4, Precision::kBf16, 758},
      {"small6 fp32", 6, 384, 6, 256, 8, Precision::kFp32, 1057},
      {"small6 bf16", 6, 384, 6, 256, 8, Precision::kBf16, 2610},
  };
  const keel::plan::Accelerator cpu = keel::plan::ThisCpu({6151e9, 431e9, 24e9, 5e9});
  for (const auto& r : runs) {
    SCOPED_TRACE(r.name);
    keel::plan::Job job;
    job.model = {r.name, r.layers, r.hidden, r.heads, 50257, r.seq};
    job.precision = r.precision;
    job.accounting = keel::plan::Accounting::kKeel;
    job.global_batch = r.batch;
    job.cluster = {cpu, 1, 1};
    job.efficiency = keel::plan::DefaultEfficiency(cpu, r.precision == Precision::kFp32);
    const auto e =
        keel::plan::Evaluate(job, {1, 1, 1, 0, r.batch, keel::plan::Recompute::kNone, false});
    EXPECT_NEAR(e.time.tokens_per_s / r.tokens_per_s, 1.0, 0.25) << e.time.tokens_per_s;
  }
}

TEST(ThisCpu, PlanMeasuresThisMachineInUnderTwoSeconds) {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const std::string cmd = std::string(KEEL_BINARY) +
                          " plan --model gpt2-tiny --accelerator this-cpu"
                          " --global-batch 8 --json --top 1 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!avx512) {  // nothing to measure with: one clear line, not a plan built on zeros
    EXPECT_NE(WEXITSTATUS(status), 0) << out;
    EXPECT_NE(out.find("needs AVX-512"), std::string::npos) << out;
    return;
  }
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  // About 0.5 s of measuring on an idle machine; the bound leaves room for a loaded one (the
  // development VM runs at load 6-8 on 2 cores) and for the process start.
  EXPECT_LT(s, 5.0) << "measuring this-cpu should take well under 2 s on an idle machine";
  const auto j = nlohmann::json::parse(out);
  const auto& f = j["accelerator_figures"];
  EXPECT_EQ(j["accelerator"], "this-cpu");
  EXPECT_EQ(j["accelerators"], 1);  // one machine unless --accelerators says otherwise
  const double cores = std::thread::hardware_concurrency();
  EXPECT_GT(f["fp32_flops"].get<double>(), 16e9 * cores * 0.25);  // busy machines share cores
  EXPECT_GE(f["bf16_flops"].get<double>(), f["fp32_flops"].get<double>());
  EXPECT_LT(f["bf16_flops"].get<double>(), 5e12 * cores);  // AMX's 3 TFLOP/s per core, and room
  EXPECT_GT(f["memory_bytes"].get<double>(), 256e6);
  EXPECT_GT(f["memory_bytes_per_s"].get<double>(), 0.4e9);
  EXPECT_GT(j["layouts"][0]["tokens_per_s"].get<double>(), 0);
}

}  // namespace

// "this-cpu": the accelerator entry measured on the machine the test runs on. The figures must
// be positive and plausible for a CPU, the measurement quick, and the plan's step time close to
// what `keel train` takes on the same machine.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "keel/core/cpu_rates.h"
#include "keel/monitor/machine_probe.h"
#include "keel/plan/hardware.h"
#include "keel/plan/search.h"
#include "train/run_util.h"

namespace {

TEST(MachineProbe, PeakRatesArePositiveAndPlausiblePerThread) {
  __builtin_cpu_init();
  const auto r = keel::MeasurePeakRates(1, 0.05, 2);
  if (!__builtin_cpu_supports("avx512f")) {
    // AVX2 + FMA: the 256-bit loop, 16 FLOP per instruction: 0.5-6 GHz with 1-2 FMA ports is
    // 8..200 GFLOP/s on one core. No bf16 instructions without AVX-512.
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
      EXPECT_EQ(r.fp32_fma, 0);
      EXPECT_EQ(r.fma_bits, 0);
      return;
    }
    EXPECT_EQ(r.fma_bits, 256);
    EXPECT_GT(r.fp32_fma, 8e9);
    EXPECT_LT(r.fp32_fma, 200e9);
    EXPECT_EQ(r.fp32_fma256, r.fp32_fma);
    EXPECT_EQ(r.bf16(), 0);
    return;
  }
  // One core: an AVX-512 FMA loop does 32 FLOP per instruction, so at 0.5-6 GHz with 1-2 FMA
  // ports that is 16..400 GFLOP/s; anything outside means the loop or the clock is wrong.
  EXPECT_EQ(r.fma_bits, 512);
  EXPECT_GT(r.fp32_fma, 16e9);
  EXPECT_LT(r.fp32_fma, 400e9);
  // The same FMAs on ymm: half the zmm rate where a core has two 512-bit FMA ports (Xeons), about
  // the zmm rate where 512-bit FMAs are split in two (AMD Zen 4). Never more than 1.3x the zmm.
  EXPECT_GT(r.fp32_fma256, 0.3 * r.fp32_fma);
  EXPECT_LT(r.fp32_fma256, 1.3 * r.fp32_fma);
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
  EXPECT_EQ(a.measured_flops, 0);
}

// A measured kernel rate sets the default efficiency: measured / peak of that precision, so
// that the planner's compute time is FLOPs / measured rate. The other precision, and an
// accelerator without a measurement, keep the old constants.
TEST(ThisCpu, MeasuredRateSetsTheEfficiency) {
  keel::plan::CpuFigures f{0.2e12,
                           0.2e12,
                           32e9,
                           5e9,
                           /*measured_flops=*/0.1e12,
                           /*measured_fp32=*/false};
  const auto a = keel::plan::ThisCpu(f);
  EXPECT_DOUBLE_EQ(keel::plan::DefaultEfficiency(a, /*fp32=*/false), 0.5);
  EXPECT_DOUBLE_EQ(keel::plan::DefaultEfficiency(a, /*fp32=*/true), 0.50);
  f.measured_fp32 = true;
  f.measured_flops = 0.05e12;
  EXPECT_DOUBLE_EQ(keel::plan::DefaultEfficiency(keel::plan::ThisCpu(f), true), 0.25);
  // A CPU with no peak loop: the measured rate stands in for the peak.
  const auto bare = keel::plan::ThisCpu({0, 0, 32e9, 5e9, 0.07e12, true});
  EXPECT_EQ(keel::plan::PeakFlops(bare, true), 0.07e12);
  EXPECT_DOUBLE_EQ(keel::plan::DefaultEfficiency(bare, true), 1.0);
}

// docs/PERFORMANCE.md, "Results (2026-11-30)": keel's measured tokens/s on the 2-core AMX VM,
// idle, with the peaks measured in the same invocation (fp32 FMA 431, AMX bf16 6151 GFLOP/s).
// Without a measured kernel rate (keel preflight's expectation) the plan on this-cpu falls back
// to efficiencies fitted there, and must predict each within 25%. The 124M rows are where those
// constants come from; small6 is independent. `keel plan` itself measures instead (below).
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
    const auto e = keel::plan::Evaluate(job, keel::plan::Layout::Of({1, 1, 1, 0}, r.batch));
    EXPECT_NEAR(e.time.tokens_per_s / r.tokens_per_s, 1.0, 0.25) << e.time.tokens_per_s;
  }
}

// `keel ARGS` with stderr folded into stdout; the environment (OMP_NUM_THREADS) is inherited, so
// that the plan and the training runs below use the same threads.
keel::test::RunResult Keel(const std::string& args) {
  return keel::test::RunCommand("{ " + std::string(KEEL_BINARY) + " " + args + "; } 2>&1");
}

TEST(ThisCpu, PlanMeasuresThisMachineInUnderTwoSeconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = Keel(
      "plan --model gpt2-tiny --accelerator this-cpu --global-batch 8 --json --top 1 "
      "--accounting keel");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Every CPU is measured: AVX-512 or not, the kernels keel trains with are timed.
  ASSERT_EQ(r.code, 0) << r.out;
  // About 0.5 s of measuring on an idle machine; the bound leaves room for a loaded one (the
  // development VM runs at load 6-8 on 2 cores) and for the process start.
  EXPECT_LT(s, 5.0) << "measuring this-cpu should take well under 2 s on an idle machine";
  const auto j = nlohmann::json::parse(r.out);
  const auto& f = j["accelerator_figures"];
  EXPECT_EQ(j["accelerator"], "this-cpu");
  EXPECT_EQ(j["accelerators"], 1);  // one machine unless --accelerators says otherwise
  const double cores = std::thread::hardware_concurrency();
  EXPECT_GT(f["fp32_flops"].get<double>(), 8e9 * cores * 0.25);  // busy machines share cores
  EXPECT_GE(f["bf16_flops"].get<double>(), f["fp32_flops"].get<double>());
  EXPECT_LT(f["bf16_flops"].get<double>(), 5e12 * cores);  // AMX's 3 TFLOP/s per core, and room
  EXPECT_GT(f["memory_bytes"].get<double>(), 256e6);
  EXPECT_GT(f["memory_bytes_per_s"].get<double>(), 0.4e9);
  // The measured rate of keel's kernels, below the peak, and the efficiency that follows.
  const double measured = f["measured_flops"].get<double>();
  EXPECT_GT(measured, 0);
  EXPECT_LE(measured, 1.1 * f["bf16_flops"].get<double>());
  EXPECT_NEAR(j["efficiency"].get<double>(), measured / f["bf16_flops"].get<double>(), 1e-9);
  EXPECT_NE(f["measured"].get<std::string>().find("keel's bf16 kernels"), std::string::npos);
  EXPECT_GT(j["layouts"][0]["tokens_per_s"].get<double>(), 0);
}

// The table says which figures were measured; --efficiency skips the kernel timing and says so.
TEST(ThisCpu, OutputNamesTheMeasuredFigures) {
  auto r = Keel("plan --model gpt2-tiny --accelerator this-cpu --global-batch 8 --top 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("this-cpu: matmul efficiency"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GFLOP/s measured"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("keel's bf16 kernels on gpt2-tiny's shapes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Peaks:"), std::string::npos) << r.out;
  r = Keel(
      "plan --model gpt2-tiny --accelerator this-cpu --global-batch 8 --top 1 --efficiency 0.3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("efficiency 0.3 as given"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("GFLOP/s measured"), std::string::npos) << r.out;
}

// The median of steps 2..N of a run's metrics.jsonl, in seconds (step 1 builds the kernels).
double MedianStepSeconds(const std::string& metrics) {
  std::vector<double> ms;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["step"].get<int>() > 1) ms.push_back(j["ms"].get<double>());
  }
  if (ms.empty()) return 0;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return (n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2) / 1e3;
}

// The bar: the plan's step time on this-cpu within 20% of what `keel train` takes for
// the same model, micro-batch, sequence length and precision, on whatever CPU runs the test. A
// real run of gpt2-mini (B=4, T=256, 5 steps; the median of steps 2-5) against `keel plan`
// right after it. Other load on the machine moves both, not always alike (on a shared 2-core VM the
// kernel measurement alone has moved by 1.7x between attempts): an attempt whose ratio is off is
// repeated, up to 5 in all, and the test fails only if none is within 20% (a wrong model is off
// every time). GPT-2 124M is compared by hand in docs/PERFORMANCE.md.
TEST(ThisCpu, PlanStepTimeMatchesKeelTrainWithin20Percent) {
  keel::test::TempDir dir;
  const std::string all =
      keel::test::ReadFile(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.u16");
  ASSERT_GT(all.size(), 400000u) << "missing ../shared/data/brown/brown.gpt2.u16";
  const std::string data = dir / "brown.u16";
  std::ofstream(data, std::ios::binary).write(all.data(), 400000);
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    std::string seen;
    bool within = false;
    for (int attempt = 0; attempt < 5 && !within; ++attempt) {
      const std::string name = std::string("mini_") + precision + "_" + std::to_string(attempt);
      auto train = Keel("train " + std::string(KEEL_SOURCE_DIR) +
                        "/configs/test-tiny.toml --set model.name=gpt2-mini --set data.seq_len=256"
                        " --set train.batch_size=4 --set train.steps=5 --set train.precision=" +
                        precision + " --set data.train=" + data +
                        " --set train.out_dir=" + dir.path() + " --set train.name=" + name +
                        " --set checkpoint.at_end=false --set checkpoint.save_final=false");
      ASSERT_EQ(train.code, 0) << train.out;
      const double trained = MedianStepSeconds(dir / (name + "/metrics.jsonl"));
      ASSERT_GT(trained, 0) << train.out;
      auto plan = Keel(std::string("plan --model gpt2-mini --seq 256 --accelerator this-cpu") +
                       " --accounting keel --global-batch 4 --micro-batch 4 --precision " +
                       precision + " --json --top 1");
      ASSERT_EQ(plan.code, 0) << plan.out;
      const auto j = nlohmann::json::parse(plan.out);
      ASSERT_TRUE(j["layouts"][0]["fits"].get<bool>()) << plan.out;
      const double planned = j["layouts"][0]["step_s"].get<double>();
      const double ratio = planned / trained;
      char buf[160];
      std::snprintf(buf, sizeof(buf),
                    "attempt %d: keel train %.3f s/step, keel plan %.3f s (%+.0f%%)\n", attempt + 1,
                    trained, planned, 100 * (ratio - 1));
      seen += buf;
      seen += "  " + j["accelerator_figures"]["measured"].get<std::string>() + "\n";
      within = std::abs(ratio - 1) <= 0.2;
    }
    EXPECT_TRUE(within) << seen;
    std::printf("%s %s", precision, seen.c_str());
  }
}

}  // namespace

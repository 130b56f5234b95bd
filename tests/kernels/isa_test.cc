// The per-ISA kernels (kernels/cpu/isa.h) and their choice at start (kernels/cpu_isa.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "keel/core/cpu_rates.h"
#include "keel/core/error.h"
#include "keel/kernels/backend.h"
#include "keel/kernels/cpu_isa.h"

namespace keel::test {
void StoreOneOneZeroZero(uint64_t* p);  // isa_case.cc
}

namespace keel::kernels {
namespace {

TEST(CpuIsa, NamesRoundTrip) {
  for (CpuIsa isa : {CpuIsa::kSse42, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    CpuIsa back;
    ASSERT_TRUE(ParseCpuIsa(IsaName(isa), &back)) << IsaName(isa);
    EXPECT_EQ(back, isa);
  }
  CpuIsa isa;
  EXPECT_FALSE(ParseCpuIsa("avx1024", &isa));
  EXPECT_FALSE(ParseCpuIsa("", &isa));
}

TEST(CpuIsa, ChoosesTheWidestThisCpuRuns) {
  ASSERT_EQ(std::getenv("KEEL_CPU_ISA"), nullptr) << "the test chooses for itself";
  CpuIsa chosen = ChosenCpuIsa();
  EXPECT_TRUE(CpuIsaAvailable(chosen));
  for (CpuIsa wider : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (int(wider) > int(chosen)) EXPECT_FALSE(CpuIsaAvailable(wider)) << IsaName(wider);
  EXPECT_EQ(&Cpu(), &CpuBackendFor(chosen));
}

TEST(CpuIsa, EachIsaHasItsOwnBackend) {
  EXPECT_NE(&CpuBackendFor(CpuIsa::kSse42), &CpuBackendFor(CpuIsa::kAvx2));
  EXPECT_NE(&CpuBackendFor(CpuIsa::kAvx2), &CpuBackendFor(CpuIsa::kAvx512));
}

// A job on mixed CPUs narrows every rank to the narrowest set (train/run_setup.cc); a limit never
// widens. In a child process, since the choice is the process's.
TEST(CpuIsa, LimitOnlyNarrows) {
  EXPECT_EXIT(
      {
        LimitCpuIsa(CpuIsa::kSse42);
        bool ok = ChosenCpuIsa() == CpuIsa::kSse42 && &Cpu() == &CpuBackendFor(CpuIsa::kSse42);
        LimitCpuIsa(CpuIsa::kAvx512);
        ok = ok && ChosenCpuIsa() == CpuIsa::kSse42;
        std::exit(ok ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

TEST(CpuIsa, WideConstantStoresKeepTheirZeros) {
  if (!CpuIsaAvailable(CpuIsa::kAvx512))
    GTEST_SKIP() << "this CPU has no AVX-512, where the GCC 12 miscompile would show";
  uint64_t v[4] = {9, 9, 9, 9};
  test::StoreOneOneZeroZero(v);
  EXPECT_EQ(v[0], 1u);
  EXPECT_EQ(v[1], 1u);
  EXPECT_EQ(v[2], 0u) << "GCC broadcast the low word (CMakeLists.txt, -mmove-max)";
  EXPECT_EQ(v[3], 0u);
}

// bf16 products widen to fp32 where the bf16 instruction is slower than the FMA: vdpbf16ps on a
// Sapphire Rapids whose AMX is hidden (measured 169 against 349 GFLOP/s), not on AMD Zen 4 (468
// against 234) or with AMX; always without bf16 instructions. On this CPU the choice follows its
// rates, measured here again and longer than the choice's own probe.
TEST(CpuIsa, Bf16ProductsWidenWhereTheDotIsSlowerThanTheFma) {
  auto rates = [](double dpbf16, double amx, double fma) {
    PeakRates r;
    r.bf16_dpbf16 = dpbf16, r.amx_bf16 = amx, r.fp32_fma = fma;
    return r;
  };
  EXPECT_TRUE(rates(169e9, 0, 349e9).bf16_in_fp32());
  EXPECT_EQ(rates(169e9, 0, 349e9).bf16_products(), 349e9);
  EXPECT_FALSE(rates(468e9, 0, 234e9).bf16_in_fp32());
  EXPECT_EQ(rates(468e9, 0, 234e9).bf16_products(), 468e9);
  EXPECT_FALSE(rates(169e9, 6376e9, 426e9).bf16_in_fp32());
  EXPECT_TRUE(rates(0, 0, 188e9).bf16_in_fp32());
  ASSERT_EQ(std::getenv("KEEL_BF16_PRODUCTS"), nullptr) << "the test lets keel choose";
  const PeakRates r = MeasurePeakRates(1, 0.02, 3);
  EXPECT_EQ(Bf16ProductsInFp32(), r.bf16_in_fp32())
      << "bf16 " << r.bf16() / 1e9 << " GFLOP/s, fp32 FMA " << r.fp32_fma / 1e9;
}

// KEEL_BF16_PRODUCTS chooses instead of the rates, and a wrong value names itself. Each case in a
// fresh process (threadsafe death tests re-run the binary), since the choice is the process's.
TEST(CpuIsa, Bf16ProductsFollowTheEnvironment) {
  testing::GTEST_FLAG(death_test_style) = "threadsafe";
  EXPECT_EXIT(
      {
        setenv("KEEL_BF16_PRODUCTS", "fp32", 1);
        std::exit(Bf16ProductsInFp32() ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("KEEL_BF16_PRODUCTS", "native", 1);
        std::exit(Bf16ProductsInFp32() ? 1 : 0);
      },
      testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("KEEL_BF16_PRODUCTS", "amx", 1);
        try {
          Bf16ProductsInFp32();
        } catch (const Error& e) {
          std::fprintf(stderr, "%s\n", e.what());
          std::exit(2);
        }
        std::exit(0);
      },
      testing::ExitedWithCode(2), "KEEL_BF16_PRODUCTS=amx: expected native or fp32");
}

// A subnormal product and a subnormal operand, where the compiler cannot fold them.
float SubnormalProduct() {
  volatile float a = 1e-20f, b = 1e-19f;
  return a * b;
}
float SubnormalOperand() {
  volatile float a = 1e-39f, one = 1.0f;
  return a * one;
}

TEST(CpuIsa, DenormalsAreFlushedInThePoolAndInThreadsStartedAfter) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "keel flushes them on x86-64 only";
#endif
  FlushDenormals();
  EXPECT_TRUE(DenormalsFlushed());
  EXPECT_EQ(SubnormalProduct(), 0.0f) << "flush-to-zero is off";
  EXPECT_EQ(SubnormalOperand(), 0.0f) << "denormals-are-zero is off";
  float later[2] = {1, 1};
  std::thread([&] { later[0] = SubnormalProduct(), later[1] = SubnormalOperand(); }).join();
  EXPECT_EQ(later[0], 0.0f);
  EXPECT_EQ(later[1], 0.0f);
}

}  // namespace
}  // namespace keel::kernels

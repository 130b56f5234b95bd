// Why bf16 runs keep an fp32 master copy: adding 1e-4 to a weight of 1.0 ten thousand times stalls
// in pure bf16 (its spacing at 1.0 is 2^-7 ≈ 7.8e-3, so 1e-4 rounds away every time) but reaches
// 2.0 through an fp32 master; and AdamWUpdate's bf16 overload really updates from the master, never
// from the working copy.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/adamw.h"

namespace keel::kernels::cpu {
namespace {

constexpr int kSteps = 10000;
constexpr float kIncrement = 1e-4f;

TEST(Precision, PureBf16AccumulatorStalls) {
  bf16 w = ToBf16(1.0f);
  for (int i = 0; i < kSteps; ++i) w = ToBf16(ToFloat(w) + kIncrement);
  EXPECT_EQ(ToFloat(w), 1.0f);
}

TEST(Precision, Fp32MasterReachesTwo) {
  float w = 1.0f;
  for (int i = 0; i < kSteps; ++i) w += kIncrement;
  // fp32's spacing in [1, 2) is 1.2e-7; 10,000 roundings of at most half of it stay below 6e-4.
  EXPECT_NEAR(w, 2.0f, 1e-3f);
}

// With a constant gradient g, m̂ = g and v̂ = g² (bias correction removes the start-up), so each
// AdamW step moves the weight by lr·g/(|g| + eps) ≈ lr. With g = -1 and lr = 1e-4 that is the
// +1e-4 of the tests above; weight decay is off so that nothing else moves the weight.
AdamWParams ConstantStepParams(int step) {
  AdamWParams p;
  p.lr = kIncrement;
  p.weight_decay = 0.0f;
  p.step = step;
  return p;
}
constexpr float kGrad = -1.0f;

// n > 1 and not a multiple of the vector width, so the vector loop and its tail both run.
constexpr size_t kN = 37;

TEST(Precision, AdamWBf16OverloadReachesTwoThroughMasterCopy) {
  std::vector<float> master(kN, 1.0f), m(kN, 0.0f), v(kN, 0.0f), grad(kN, kGrad);
  std::vector<bf16> working(kN, ToBf16(1.0f));
  for (int step = 1; step <= kSteps; ++step)
    AdamWUpdate(master.data(), working.data(), m.data(), v.data(), grad.data(), kN,
                ConstantStepParams(step));
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(master[i], 2.0f, 1e-3f);
    // bf16's spacing at 2.0 is 2^-6 ≈ 1.6e-2 (just below, 2^-7); rounding to nearest is within
    // half.
    EXPECT_NEAR(ToFloat(working[i]), 2.0f, 1e-2f);
    EXPECT_EQ(working[i].bits, ToBf16(master[i]).bits);
  }
}

// The same AdamW steps applied to the bf16 weight itself — the master re-read from the bf16 copy
// before every step, as a run without a master copy would do — never leave 1.0.
TEST(Precision, AdamWStepsAppliedDirectlyInBf16Stall) {
  std::vector<float> master(kN), m(kN, 0.0f), v(kN, 0.0f), grad(kN, kGrad);
  std::vector<bf16> working(kN, ToBf16(1.0f));
  for (int step = 1; step <= kSteps; ++step) {
    for (size_t i = 0; i < kN; ++i) master[i] = ToFloat(working[i]);
    AdamWUpdate(master.data(), working.data(), m.data(), v.data(), grad.data(), kN,
                ConstantStepParams(step));
  }
  for (size_t i = 0; i < kN; ++i) EXPECT_EQ(ToFloat(working[i]), 1.0f);
}

// The working copy is output only: corrupting it between steps changes nothing in the master, and
// the next step rewrites it from the master.
TEST(Precision, AdamWWorkingCopyIsDerivedFromMaster) {
  std::vector<float> master(kN, 1.0f), m(kN, 0.0f), v(kN, 0.0f), grad(kN, kGrad);
  std::vector<float> clean_master(kN, 1.0f), clean_m(kN, 0.0f), clean_v(kN, 0.0f);
  std::vector<bf16> working(kN, ToBf16(1.0f)), clean_working(kN, ToBf16(1.0f));
  for (int step = 1; step <= 100; ++step) {
    if (step % 10 == 0)
      for (auto& w : working) w = ToBf16(-5.0f);
    AdamWUpdate(master.data(), working.data(), m.data(), v.data(), grad.data(), kN,
                ConstantStepParams(step));
    AdamWUpdate(clean_master.data(), clean_working.data(), clean_m.data(), clean_v.data(),
                grad.data(), kN, ConstantStepParams(step));
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_EQ(master[i], clean_master[i]) << "step " << step;
      ASSERT_EQ(working[i].bits, ToBf16(master[i]).bits) << "step " << step;
    }
  }
  EXPECT_NEAR(master[0], 1.0f + 100 * kIncrement, 1e-5f);
}

}  // namespace
}  // namespace keel::kernels::cpu

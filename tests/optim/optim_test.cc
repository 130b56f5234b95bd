// LR schedules, global gradient norm and clipping, AdamW's weight-decay ranges, and the dynamic
// loss scaler's sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "keel/optim/adamw.h"
#include "keel/optim/loss_scaler.h"
#include "keel/optim/schedule.h"

namespace keel::optim {
namespace {

TEST(LrSchedule, WarmsUpLinearlyThenDecaysToTheFloor) {
  LrSchedule s{LrSchedule::kCosine, 1.0f, 0.1f, 10, 110};
  EXPECT_FLOAT_EQ(s.At(0), 0.1f);
  EXPECT_FLOAT_EQ(s.At(4), 0.5f);
  EXPECT_FLOAT_EQ(s.At(9), 1.0f);
  EXPECT_FLOAT_EQ(s.At(10), 1.0f);
  EXPECT_NEAR(s.At(60), 0.55f, 1e-6);  // halfway through the cosine
  EXPECT_NEAR(s.At(110), 0.1f, 1e-6);
  EXPECT_NEAR(s.At(500), 0.1f, 1e-6);  // past the end: the floor
  for (int i = 11; i < 110; ++i) EXPECT_LE(s.At(i), s.At(i - 1));
}

TEST(LrSchedule, LinearAndConstant) {
  LrSchedule lin{LrSchedule::kLinear, 1.0f, 0.0f, 0, 100};
  EXPECT_NEAR(lin.At(25), 0.75f, 1e-6);
  LrSchedule c{LrSchedule::kConstant, 0.3f, 0.0f, 2, 100};
  EXPECT_FLOAT_EQ(c.At(0), 0.15f);
  EXPECT_FLOAT_EQ(c.At(50), 0.3f);
  EXPECT_THROW(LrSchedule::ParseKind("exp"), std::exception);
}

TEST(GradNorm, MatchesFloat64AndClips) {
  std::vector<float> g(300000);
  double ref = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = float(std::sin(double(i)) * 1e-2);
    ref += double(g[i]) * g[i];
  }
  const double norm = GlobalGradNorm(g.data(), g.size());
  EXPECT_NEAR(norm, std::sqrt(ref), 1e-12 * std::sqrt(ref) * 1e3);
  EXPECT_FLOAT_EQ(ClipScale(norm, 0.0f), 1.0f);
  EXPECT_FLOAT_EQ(ClipScale(0.5, 1.0f), 1.0f);
  EXPECT_NEAR(ClipScale(4.0, 1.0f), 0.25f, 1e-6);
  EXPECT_FLOAT_EQ(ClipScale(NAN, 1.0f), 1.0f);  // non-finite norms are the caller's to report
}

TEST(AdamW, DecaysOnlyTheRangesMarkedForDecay) {
  // Zero gradients: only weight decay moves the weights.
  std::vector<float> w = {1, 1, 1, 1}, g(4, 0.0f);
  AdamW opt({{0, 2, true}, {2, 2, false}}, 4, {0.9f, 0.95f, 1e-8f, 0.5f});
  opt.Step(w.data(), nullptr, g.data(), 0.1f, 1.0f);
  EXPECT_FLOAT_EQ(w[0], 1.0f - 0.1f * 0.5f);
  EXPECT_FLOAT_EQ(w[1], 1.0f - 0.1f * 0.5f);
  EXPECT_FLOAT_EQ(w[2], 1.0f);
  EXPECT_FLOAT_EQ(w[3], 1.0f);
  EXPECT_EQ(opt.step(), 1);
}

TEST(AdamW, FirstStepMovesEachWeightByTheLearningRate) {
  // With bias correction, step 1 is lr · g/|g| for any gradient scale.
  std::vector<float> w = {0, 0}, g = {3.0f, -1e-3f};
  AdamW opt({{0, 2, false}}, 2, {});
  opt.Step(w.data(), nullptr, g.data(), 0.01f, 1.0f);
  EXPECT_NEAR(w[0], -0.01f, 1e-6);
  EXPECT_NEAR(w[1], 0.01f, 1e-5);
}

// Megatron-LM's DynamicGradScaler, step by step (initial 1024, min 256, growth every 3 clean
// steps, hysteresis 2): the first overflow is tolerated, the second backs off; later overflows
// back off at once until a growth re-arms the hysteresis; the minimum holds and is counted.
TEST(LossScaler, FollowsMegatronsDynamicGradScaler) {
  LossScaler s({1024, 256, 2, 0.5, 3, 2});
  struct Want {
    bool overflow;
    double scale_after;
  };
  const Want seq[] = {{false, 1024}, {true, 1024}, {true, 512},   {false, 512}, {false, 512},
                      {false, 1024}, {true, 1024}, {false, 1024}, {true, 512},  {true, 256},
                      {true, 256},   {true, 256},  {false, 256},  {false, 256}, {false, 512}};
  int k = 0;
  for (const Want& w : seq) {
    s.Update(w.overflow);
    EXPECT_EQ(s.scale(), w.scale_after) << "after update " << k;
    ++k;
  }
  EXPECT_EQ(s.state().steps_at_minimum, 0);  // reset by the clean steps
}

TEST(LossScaler, CountsOverflowsAtTheMinimumAndNeverGoesBelow) {
  LossScaler s({4, 1, 2, 0.5, 1000, 1});
  for (int i = 0; i < 10; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 1);
  EXPECT_EQ(s.state().steps_at_minimum, 8);  // 4 -> 2 -> 1, then eight at 1 (the 3rd..10th)
  EXPECT_TRUE(s.at_minimum());
  LossScaler t({4, 1, 2, 0.5, 1000, 1});
  t.Restore(s.state());
  EXPECT_EQ(t.state(), s.state());
}

// A state saved under a longer growth interval than the resumed run's (800 clean steps, now 200)
// grows at the next clean step instead of never again.
TEST(LossScaler, GrowsAfterAResumeIntoAShorterGrowthInterval) {
  LossScaler s({1024, 1, 2, 0.5, 200, 2});
  EXPECT_FALSE(s.at_minimum());
  s.Restore({1024, 800, 2, 0});
  s.Update(false);
  EXPECT_EQ(s.scale(), 2048);
  EXPECT_EQ(s.state().growth_tracker, 0);
}

}  // namespace
}  // namespace keel::optim

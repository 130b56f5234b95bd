// The fp8 formats and scaling recipes (core/fp8.h) against the OCP definitions: known codes, every
// code's round trip, ties to even, saturation; power-of-two scales; current and delayed scaling
// and the fallback reasons. tests/reference/fp8_reference.py checks the same numbers again,
// independently, on tensors a real fp8 run recorded (tests/train/fp8.sh).
#include "keel/core/fp8.h"

#include <gtest/gtest.h>

#include <cmath>

namespace keel {
namespace {

constexpr Fp8Format kE4M3 = Fp8Format::kE4M3, kE5M2 = Fp8Format::kE5M2;

TEST(Fp8, KnownCodes) {
  EXPECT_EQ(FromFp8(0x7E, kE4M3), 448.0f);
  EXPECT_TRUE(std::isnan(FromFp8(0x7F, kE4M3)));
  EXPECT_EQ(FromFp8(0x08, kE4M3), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(FromFp8(0x01, kE4M3), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(FromFp8(0x38, kE4M3), 1.0f);
  EXPECT_EQ(FromFp8(0xB8, kE4M3), -1.0f);
  EXPECT_EQ(FromFp8(0x7B, kE5M2), 57344.0f);
  EXPECT_EQ(FromFp8(0x7C, kE5M2), INFINITY);
  EXPECT_TRUE(std::isnan(FromFp8(0x7D, kE5M2)));
  EXPECT_EQ(FromFp8(0x01, kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(FromFp8(0x3C, kE5M2), 1.0f);
}

TEST(Fp8, EveryFiniteCodeRoundTrips) {
  for (Fp8Format f : {kE4M3, kE5M2})
    for (int c = 0; c < 256; ++c) {
      const float v = FromFp8(uint8_t(c), f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(RoundFp8(v, f), v) << Fp8FormatName(f) << " code " << c;
      if (c != 0x80) EXPECT_EQ(ToFp8(v, f), c) << Fp8FormatName(f) << " code " << c;
    }
}

TEST(Fp8, TiesToEvenAndSaturation) {
  EXPECT_EQ(RoundFp8(1.0625f, kE4M3), 1.0f);   // between 1 and 1.125: 1 is even
  EXPECT_EQ(RoundFp8(1.1875f, kE4M3), 1.25f);  // between 1.125 and 1.25: 1.25 is even
  EXPECT_EQ(RoundFp8(1.126f, kE4M3), 1.125f);
  EXPECT_EQ(RoundFp8(std::ldexp(1.0f, -10), kE4M3), 0.0f);  // half the smallest subnormal
  EXPECT_EQ(RoundFp8(std::ldexp(3.0f, -11), kE4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(RoundFp8(1000.0f, kE4M3), 448.0f);
  EXPECT_EQ(RoundFp8(-INFINITY, kE4M3), -448.0f);
  EXPECT_EQ(RoundFp8(1e9f, kE5M2), 57344.0f);
  EXPECT_EQ(RoundFp8(1.125f, kE5M2), 1.0f);  // two mantissa bits: 1, 1.25
  EXPECT_TRUE(std::isnan(RoundFp8(NAN, kE5M2)));
  EXPECT_EQ(ToFp8(-1000.0f, kE4M3), 0xFE);
}

TEST(Fp8, ScalesArePowersOfTwoThatFit) {
  EXPECT_EQ(Fp8Scale(448.0f, kE4M3), 1.0f);
  EXPECT_EQ(Fp8Scale(449.0f, kE4M3), 0.5f);
  EXPECT_EQ(Fp8Scale(1.0f, kE4M3), 256.0f);  // 448 / 1 = 1.75·2^8
  EXPECT_EQ(Fp8Scale(0.001f, kE5M2), std::ldexp(1.0f, 25));
  EXPECT_EQ(Fp8Scale(0.0f, kE4M3), 1.0f);
  EXPECT_EQ(Fp8Scale(NAN, kE4M3), 1.0f);
  for (float amax : {1e-30f, 3e-5f, 0.7f, 1.0f, 300.0f, 5e4f, 1e30f}) {
    const float s = Fp8Scale(amax, kE4M3);
    EXPECT_LE(double(amax) * s, 448.0) << amax;
    EXPECT_GT(double(amax) * s, 224.0) << amax;
  }
}

TEST(Fp8Tracker, CurrentScalingUsesEachAmax) {
  Fp8Tracker t(kE4M3, Fp8Recipe{});
  EXPECT_EQ(t.Scale(1.0f), 256.0f);
  EXPECT_EQ(t.Scale(4.0f), 64.0f);
  EXPECT_EQ(t.step_amax(), 4.0f);
  EXPECT_EQ(t.EndStep(t.step_amax()), "");
  EXPECT_EQ(t.history_max(), 4.0f);
  EXPECT_EQ(t.Scale(1.0f), 256.0f);  // still its own amax
}

TEST(Fp8Tracker, DelayedScalingUsesTheHistory) {
  Fp8Tracker t(kE4M3, Fp8Recipe{.delayed = true, .history = 2, .spike = 0});
  EXPECT_EQ(t.Scale(1.0f), 256.0f);  // no history yet: current
  EXPECT_EQ(t.EndStep(1.0f), "");
  EXPECT_EQ(t.Scale(8.0f), 256.0f);  // the history's 1, not this step's 8 (which saturates)
  EXPECT_EQ(t.EndStep(8.0f), "");
  EXPECT_EQ(t.Scale(0.5f), 32.0f);  // max(1, 8)
  EXPECT_EQ(t.EndStep(0.5f), "");
  EXPECT_EQ(t.Scale(0.5f), 32.0f);  // max(8, 0.5): the 1 has left the history of 2
  EXPECT_EQ(t.EndStep(0.5f), "");
  EXPECT_EQ(t.Scale(0.5f), 512.0f);  // 448 / 0.5 = 1.75·2^9
}

TEST(Fp8Tracker, ValidationDoesNotObserveAndZeroHistoriesScaleAsCurrent) {
  Fp8Tracker t(kE4M3, Fp8Recipe{.delayed = true, .history = 4, .spike = 0});
  EXPECT_EQ(t.Scale(5.0f, /*observe=*/false), 64.0f);  // its own amax: no history yet
  EXPECT_EQ(t.step_amax(), 0.0f);
  EXPECT_EQ(t.EndStep(0.0f), "");    // an all-zero step (zero gradients)
  EXPECT_EQ(t.Scale(2.0f), 128.0f);  // the history's largest is 0: scales by its own amax
}

TEST(Fp8Tracker, NonFiniteAndSpikesAreReasons) {
  Fp8Tracker t(kE5M2, Fp8Recipe{.delayed = false, .history = 2, .spike = 10});
  t.Scale(2.0f);
  t.Scale(NAN);
  t.Scale(3.0f);
  EXPECT_EQ(t.step_amax(), INFINITY);  // what the ranks' max reduction carries to every rank
  EXPECT_EQ(t.EndStep(t.step_amax()), "amax is not finite");
  EXPECT_EQ(t.history_max(), 0.0f);  // nothing non-finite joins the history
  EXPECT_EQ(t.EndStep(INFINITY), "amax is not finite");
  EXPECT_EQ(t.EndStep(1.0f), "");
  EXPECT_EQ(t.EndStep(2.0f), "");             // history now full: {1, 2}
  EXPECT_EQ(t.EndStep(19.0f), "");            // 9.5x
  const std::string why = t.EndStep(200.0f);  // 200 / max(2, 19) = 10.5x
  EXPECT_NE(why.find("amax 200 is 11x the last 2 steps' largest (19)"), std::string::npos) << why;
}

// A checkpoint's history put back: the delayed scale and the spike test go on as if the steps
// had run here; a longer one than the recipe keeps keeps its newest.
TEST(Fp8Tracker, RestoredHistoryScalesAndJudgesAsTheOriginal) {
  const Fp8Recipe r{.delayed = true, .history = 2, .spike = 4};
  Fp8Tracker a(kE4M3, r), b(kE4M3, r);
  for (float amax : {1.0f, 8.0f, 0.5f}) EXPECT_EQ(a.EndStep(amax), "");
  EXPECT_EQ(a.history(), (std::vector<float>{8.0f, 0.5f}));
  b.Restore(a.history());
  EXPECT_EQ(b.Scale(0.25f), a.Scale(0.25f));  // 32: the history's 8
  const std::string why = b.EndStep(40.0f);   // 5x the history's 8: a spike, as for the original
  EXPECT_NE(why, "");
  EXPECT_EQ(why, a.EndStep(40.0f));
  EXPECT_NE(b.EndStep(1000.0f), "");
  Fp8Tracker c(kE4M3, r);
  c.Restore({1.0f, 2.0f, 3.0f});
  EXPECT_EQ(c.history(), (std::vector<float>{2.0f, 3.0f}));
}

}  // namespace
}  // namespace keel

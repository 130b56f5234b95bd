// The gradient wire formats (parallel/grad_wire.h): sizes, bf16's rounding, int8's per-block
// bound, error feedback's bookkeeping, and an fp16 overflow reaching the receiver.
#include "keel/parallel/grad_wire.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "keel/core/dtype.h"

namespace keel::parallel {
namespace {

std::vector<float> Ramp(size_t n, float scale) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = scale * std::sin(0.37f * float(i) + 0.1f) * float(1 + i % 5);
  return x;
}

TEST(GradWire, BytesPerFormat) {
  EXPECT_EQ(WireBytes(GradWire::kF32, 1000), 4000u);
  EXPECT_EQ(WireBytes(GradWire::kBF16, 1001), 2004u);  // whole floats
  // 4 blocks of 256: 4 scales and 1000 codes.
  EXPECT_EQ(WireBytes(GradWire::kInt8, 1000), 4u * 4 + 1000);
  EXPECT_EQ(WireBytes(GradWire::kInt8, 0), 0u);
  // A 4-rank all-reduce sends 2·3/4 of the encoded buffer.
  EXPECT_DOUBLE_EQ(WireSentBytes(GradWire::kBF16, 1 << 20, 4, true), 2.0 * 2 * (1 << 20) * 0.75);
  EXPECT_DOUBLE_EQ(WireSentBytes(GradWire::kF32, 1 << 20, 1, true), 0.0);
  EXPECT_EQ(ParseGradWire("int8"), GradWire::kInt8);
  EXPECT_FALSE(ParseGradWire("fp8").has_value());
}

TEST(GradWire, Bf16RoundsToNearestEven) {
  const std::vector<float> x = Ramp(300, 3.0f);
  std::vector<char> wire(WireBytes(GradWire::kBF16, x.size()));
  Encode(GradWire::kBF16, x.data(), x.size(), wire.data());
  std::vector<float> y(x.size());
  Decode(GradWire::kBF16, wire.data(), x.size(), y.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(y[i], ToFloat(ToBf16(x[i]))) << "at " << i;
}

TEST(GradWire, Int8IsWithinHalfAStepOfEachBlocksScale) {
  const size_t n = 3 * kInt8Block + 17;  // a short last block
  std::vector<float> x = Ramp(n, 0.01f);
  x[5] = 40.0f;  // one large element: its block's step is large, the others' are not
  std::vector<char> wire(WireBytes(GradWire::kInt8, n));
  Encode(GradWire::kInt8, x.data(), n, wire.data());
  std::vector<float> y(n);
  Decode(GradWire::kInt8, wire.data(), n, y.data());
  for (size_t b = 0; b * kInt8Block < n; ++b) {
    float amax = 0;
    const size_t lo = b * kInt8Block, hi = std::min(n, lo + kInt8Block);
    for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
    for (size_t i = lo; i < hi; ++i)
      ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * amax / 127 * 1.0001f) << "at " << i;
  }
  EXPECT_EQ(y[5], 40.0f);              // the block's largest element is exact
  EXPECT_NE(y[kInt8Block + 3], 0.0f);  // later blocks keep their own scale
}

TEST(GradWire, ErrorFeedbackCarriesWhatRoundingLost) {
  const size_t n = 2 * kInt8Block;
  const std::vector<float> x = Ramp(n, 1.0f);
  std::vector<float> err = Ramp(n, 0.003f), err0 = err;
  std::vector<char> wire(WireBytes(GradWire::kInt8, n));
  Encode(GradWire::kInt8, x.data(), n, wire.data(), err.data(), Feedback::kCarry);
  std::vector<float> y(n);
  Decode(GradWire::kInt8, wire.data(), n, y.data());
  // What was sent plus what is kept is what there was: x + the old residual.
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(y[i] + err[i], x[i] + err0[i], 1e-6f) << "at " << i;
  // kAccumulate sends x alone and adds the loss to the residual.
  std::vector<float> acc(n, 0.25f);
  Encode(GradWire::kInt8, x.data(), n, wire.data(), acc.data(), Feedback::kAccumulate);
  Decode(GradWire::kInt8, wire.data(), n, y.data());
  for (size_t i = 0; i < n; ++i) ASSERT_NEAR(acc[i], 0.25f + (x[i] - y[i]), 1e-6f) << "at " << i;
}

TEST(GradWire, AnOverflowDecodesToNanAndLeavesNoResidual) {
  const size_t n = 2 * kInt8Block;
  std::vector<float> x = Ramp(n, 1.0f), err(n, 0.5f);
  x[7] = INFINITY;
  std::vector<char> wire(WireBytes(GradWire::kInt8, n));
  Encode(GradWire::kInt8, x.data(), n, wire.data(), err.data(), Feedback::kCarry);
  std::vector<float> y(n);
  Decode(GradWire::kInt8, wire.data(), n, y.data());
  for (size_t i = 0; i < kInt8Block; ++i) {
    EXPECT_TRUE(std::isnan(y[i])) << "at " << i;
    EXPECT_EQ(err[i], 0.0f) << "at " << i;
  }
  EXPECT_TRUE(std::isfinite(y[kInt8Block]));  // the next block is untouched
  x[7] = NAN;
  Encode(GradWire::kInt8, x.data(), n, wire.data());
  Decode(GradWire::kInt8, wire.data(), n, y.data());
  EXPECT_TRUE(std::isnan(y[0]));
}

}  // namespace
}  // namespace keel::parallel

// LoRA dropout's kernel (cpu/dropout.h; the mask: kernels/op_args.h's DropoutMask) against its
// definition: kept elements are x·scale exactly and the rest 0, the kept fraction is 1 - p within
// a few standard deviations, the accumulating form adds the same values, a block of a matrix
// (rows from row0, columns from col0: a micro-batch of the global batch, a tensor-parallel shard)
// gets exactly the whole matrix's mask there, and other keys draw other masks.
#include "keel/kernels/cpu/dropout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace keel::kernels::cpu {
namespace {

DropoutMask Mask(double p, uint64_t key) {
  return {key, 0, 0, uint32_t(std::ldexp(p, 32)), float(1.0 / (1.0 - p))};
}

std::vector<float> Ramp(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = 0.25f + float(i % 97) * 0.125f;  // never zero
  return x;
}

TEST(Dropout, KeepsOneMinusPOfTheElementsScaledAndZeroesTheRest) {
  const int rows = 256, cols = 384;
  const std::vector<float> x = Ramp(size_t(rows) * cols);
  for (double p : {0.05, 0.1, 0.5}) {
    SCOPED_TRACE(p);
    const DropoutMask m = Mask(p, 42);
    std::vector<float> out(x.size(), -1.0f);
    Dropout(out.data(), x.data(), rows, cols, m, false);
    size_t kept = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const bool keep =
          DropoutKeep(DropoutRowKey(m.key, i / cols), uint32_t(i % cols), m.threshold);
      ASSERT_EQ(out[i], keep ? x[i] * m.scale : 0.0f) << i;
      kept += keep;
    }
    const double n = double(x.size()), sd = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(double(kept), n * (1 - p), 5 * sd);
    // bf16: the same mask, each value the rounding of x·scale.
    std::vector<bf16> xb(x.size()), ob(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = ToBf16(x[i]);
    Dropout(ob.data(), xb.data(), rows, cols, m, false);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(ob[i].bits, ToBf16(out[i] == 0 ? 0.0f : ToFloat(xb[i]) * m.scale).bits) << i;
  }
}

TEST(Dropout, AccumulatingAddsTheMaskedValues) {
  const int rows = 64, cols = 100;
  const std::vector<float> x = Ramp(size_t(rows) * cols);
  const DropoutMask m = Mask(0.3, 7);
  std::vector<float> alone(x.size()), sum(x.size());
  Dropout(alone.data(), x.data(), rows, cols, m, false);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = float(i % 5);
  Dropout(sum.data(), x.data(), rows, cols, m, true);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(sum[i], float(i % 5) + alone[i]) << i;
}

TEST(Dropout, ABlockGetsTheWholeMatrixsMaskThereAndOtherKeysOthers) {
  const int rows = 96, cols = 160;
  const std::vector<float> x = Ramp(size_t(rows) * cols);
  const DropoutMask m = Mask(0.25, 99);
  std::vector<float> whole(x.size());
  Dropout(whole.data(), x.data(), rows, cols, m, false);
  // Rows [32, 80) and columns [40, 120): a micro-batch's rows of a column shard.
  const int r0 = 32, nr = 48, c0 = 40, nc = 80;
  std::vector<float> xs(size_t(nr) * nc), block(xs.size());
  for (int r = 0; r < nr; ++r)
    for (int c = 0; c < nc; ++c) xs[size_t(r) * nc + c] = x[size_t(r0 + r) * cols + c0 + c];
  DropoutMask shifted = m;
  shifted.row0 = r0;
  shifted.col0 = c0;
  Dropout(block.data(), xs.data(), nr, nc, shifted, false);
  for (int r = 0; r < nr; ++r)
    for (int c = 0; c < nc; ++c)
      ASSERT_EQ(block[size_t(r) * nc + c], whole[size_t(r0 + r) * cols + c0 + c]) << r << "," << c;
  // Another key: about half the keep decisions agree (p = 0.25: 0.75² + 0.25² = 0.625).
  std::vector<float> other(x.size());
  Dropout(other.data(), x.data(), rows, cols, Mask(0.25, 100), false);
  size_t same = 0;
  for (size_t i = 0; i < x.size(); ++i) same += (other[i] == 0) == (whole[i] == 0);
  EXPECT_NEAR(double(same) / double(x.size()), 0.625, 0.02);
}

}  // namespace
}  // namespace keel::kernels::cpu

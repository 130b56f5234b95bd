// DoRA's kernels (cpu/dora.h; contracts: Backend::DoraNorm, DoraScale, DoraMagnitudeGrad) against
// their definitions in fp64, in fp32 and bf16, on widths that are no multiple of a vector or of
// the magnitude gradient's column blocks; the norm's zero row gives a zero scale, not a NaN, while
// a NaN in W or A reaches the norms of the rows that read it; and
// without a magnitude the norm kernel leaves each row's sum of squares (a tensor-parallel shard's
// part), whose sum over two halves of the columns is the whole row's.
#include "keel/kernels/cpu/dora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace keel::kernels::cpu {
namespace {

std::vector<float> Values(size_t n, int seed) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i)
    x[i] = float(int((i * 2654435761u + seed * 97) % 2001) - 1000) / 997.0f;
  return x;
}

template <typename T>
std::vector<T> As(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = FromFloat<T>(x[i]);
  return out;
}

template <typename T>
double Val(const T& x) {
  return double(ToFloat(x));
}

template <typename T>
void CheckNorm(double tol) {
  const int out = 37, in = 203, r = 5;
  const float s = 1.75f;
  const auto W = As<T>(Values(size_t(out) * in, 1)), A = As<T>(Values(size_t(r) * in, 2)),
             B = As<T>(Values(size_t(out) * r, 3));
  std::vector<T> Wz = W;
  for (int i = 0; i < in; ++i) Wz[size_t(4) * in + i] = FromFloat<T>(0.0f);  // row 4 of W + s·B·A
  std::vector<float> Bz(size_t(out) * r);
  for (size_t i = 0; i < Bz.size(); ++i) Bz[i] = ToFloat(B[i]);
  for (int j = 0; j < r; ++j) Bz[size_t(4) * r + j] = 0;
  const auto Bzt = As<T>(Bz);
  const std::vector<float> mag = Values(size_t(out), 4);
  std::vector<float> scale(static_cast<size_t>(out)), inv(static_cast<size_t>(out));
  DoraNorm(scale.data(), inv.data(), mag.data(), Wz.data(), A.data(), Bzt.data(), out, in, r, s);
  // Two column halves (a row-parallel shard each: W's and A's columns, B whole): squares that
  // add up to the whole rows' (1/inv²), the scales untouched.
  const int h = in / 2;
  std::vector<T> W0(size_t(out) * h), W1(size_t(out) * (in - h)), A0(size_t(r) * h),
      A1(size_t(r) * (in - h));
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i)
      (i < h ? W0[size_t(o) * h + i] : W1[size_t(o) * (in - h) + (i - h)]) = Wz[size_t(o) * in + i];
  for (int j = 0; j < r; ++j)
    for (int i = 0; i < in; ++i)
      (i < h ? A0[size_t(j) * h + i] : A1[size_t(j) * (in - h) + (i - h)]) = A[size_t(j) * in + i];
  std::vector<float> sq0(static_cast<size_t>(out)), sq1(static_cast<size_t>(out));
  std::vector<float> untouched(static_cast<size_t>(out), -7.0f);
  DoraNorm(untouched.data(), sq0.data(), nullptr, W0.data(), A0.data(), Bzt.data(), out, h, r, s);
  DoraNorm(untouched.data(), sq1.data(), nullptr, W1.data(), A1.data(), Bzt.data(), out, in - h, r,
           s);
  for (int o = 0; o < out; ++o) {
    EXPECT_EQ(untouched[size_t(o)], -7.0f);
    if (o == 4) continue;
    const double whole = 1.0 / (double(inv[size_t(o)]) * inv[size_t(o)]);
    EXPECT_NEAR(double(sq0[size_t(o)]) + sq1[size_t(o)], whole, 3 * tol * whole) << o;
  }
  for (int o = 0; o < out; ++o) {
    double sq = 0;
    for (int i = 0; i < in; ++i) {
      double v = Val(Wz[size_t(o) * in + i]);
      for (int j = 0; j < r; ++j)
        v += double(s) * Val(Bzt[size_t(o) * r + j]) * Val(A[size_t(j) * in + i]);
      sq += v * v;
    }
    const double n = std::sqrt(sq);
    if (o == 4) {
      EXPECT_EQ(inv[4], 0.0f);
      EXPECT_EQ(scale[4], 0.0f);
      continue;
    }
    EXPECT_NEAR(inv[size_t(o)], 1.0 / n, tol / n) << o;
    EXPECT_NEAR(scale[size_t(o)], mag[size_t(o)] / n, tol * std::fabs(mag[size_t(o)]) / n) << o;
  }
}

TEST(Dora, NormIsEachRowOfTheAdaptedWeightsNorm) {
  CheckNorm<float>(1e-5);
  CheckNorm<bf16>(1e-5);  // the inputs are bf16; the sums fp32/fp64 all the same
}

template <typename T>
void CheckScaleAndGrad(double tol) {
  const int rows = 19, cols = 517;
  const auto z = As<T>(Values(size_t(rows) * cols, 5)), dy = As<T>(Values(size_t(rows) * cols, 6));
  const std::vector<float> scale = Values(size_t(cols), 7), bias = Values(size_t(cols), 8),
                           inv = Values(size_t(cols), 9);
  std::vector<T> out = As<T>(Values(size_t(rows) * cols, 10));
  const std::vector<T> before = out;
  std::vector<T> plain(out.size());
  DoraScale(plain.data(), z.data(), scale.data(), nullptr, rows, cols, false);
  DoraScale(out.data(), z.data(), scale.data(), bias.data(), rows, cols, true);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const size_t i = size_t(r) * cols + c;
      const double zs = Val(z[i]) * scale[size_t(c)];
      ASSERT_NEAR(Val(plain[i]), zs, tol * (1 + std::fabs(zs))) << r << "," << c;
      const double want = zs + bias[size_t(c)] + Val(before[i]);
      ASSERT_NEAR(Val(out[i]), want, tol * (1 + std::fabs(want))) << r << "," << c;
    }
  std::vector<float> dmag = Values(size_t(cols), 11);
  const std::vector<float> dmag0 = dmag;
  DoraMagnitudeGrad(dmag.data(), dy.data(), z.data(), inv.data(), rows, cols);
  for (int c = 0; c < cols; ++c) {
    double dot = 0;
    for (int r = 0; r < rows; ++r)
      dot += Val(dy[size_t(r) * cols + c]) * Val(z[size_t(r) * cols + c]);
    const double want = dmag0[size_t(c)] + inv[size_t(c)] * dot;
    EXPECT_NEAR(dmag[size_t(c)], want, 1e-5 * (1 + std::fabs(want))) << c;
  }
}

TEST(Dora, ScaleAndMagnitudeGradientFollowTheirDefinitions) {
  CheckScaleAndGrad<float>(1e-6);
  CheckScaleAndGrad<bf16>(8e-3);  // one bf16 rounding of the result
}

// A NaN or an infinity in a row of W, or a NaN anywhere in A (every row reads it through B·A),
// makes those rows' inverse norm and scale NaN, so that the backward's dz = dy ⊙ scale carries it
// too; a zero row's stay 0. (`n > 0 ? 1/n : 0` made a NaN norm's 0.)
TEST(Dora, ANanReachesTheNormsOfTheRowsThatReadIt) {
  const int out = 9, in = 40, r = 3;
  std::vector<float> W = Values(size_t(out) * in, 1), A = Values(size_t(r) * in, 2),
                     B = Values(size_t(out) * r, 3);
  const std::vector<float> mag = Values(size_t(out), 4);
  std::fill_n(W.begin() + 5 * in, in, 0.0f);  // row 5: W, and B's row, zero
  std::fill_n(B.begin() + 5 * r, r, 0.0f);
  W[size_t(2) * in + 7] = std::nanf("");
  W[size_t(6) * in + 1] = INFINITY;  // 1/inf would be 0: as silent as the NaN's
  std::vector<float> scale(static_cast<size_t>(out)), inv(static_cast<size_t>(out));
  DoraNorm(scale.data(), inv.data(), mag.data(), W.data(), A.data(), B.data(), out, in, r, 1.0f);
  for (int o = 0; o < out; ++o) {
    EXPECT_EQ(std::isnan(inv[size_t(o)]), o == 2 || o == 6) << o << ": " << inv[size_t(o)];
    EXPECT_EQ(std::isnan(scale[size_t(o)]), o == 2 || o == 6) << o << ": " << scale[size_t(o)];
  }
  EXPECT_EQ(inv[5], 0.0f);
  EXPECT_EQ(scale[5], 0.0f);
  W[size_t(2) * in + 7] = 1.0f;
  W[size_t(6) * in + 1] = 1.0f;
  A[size_t(1) * in + 11] = std::nanf("");  // every row: B·A reads it (0·NaN too, as in PyTorch)
  DoraNorm(scale.data(), inv.data(), mag.data(), W.data(), A.data(), B.data(), out, in, r, 1.0f);
  for (int o = 0; o < out; ++o) {
    EXPECT_TRUE(std::isnan(inv[size_t(o)])) << o << ": " << inv[size_t(o)];
    EXPECT_TRUE(std::isnan(scale[size_t(o)])) << o << ": " << scale[size_t(o)];
  }
}

}  // namespace
}  // namespace keel::kernels::cpu

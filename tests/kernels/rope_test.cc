// Rotary positions: forward against a float64 reference in Hugging Face's "rotate half" layout
// (query and key heads rotated, value heads untouched, positions from pos0), and backward against
// float64 central differences of L = Σ out·R.
#include "keel/kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::MaxRelError;
using test::RandomVector;
using test::RoundTrip;
using test::ToDouble;
using test::ToTyped;

struct Shape {
  int B, T, NH, NKV, hs, pos0;
  size_t size() const { return size_t(B) * T * (NH + 2 * NKV) * hs; }
};

constexpr float kTheta = 10000.0f;

std::vector<double> RopeRef(std::vector<double> x, const Shape& s) {
  const int row = (s.NH + 2 * s.NKV) * s.hs, h2 = s.hs / 2;
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.NH + s.NKV; ++h) {
        double* v = &x[(size_t(b) * s.T + t) * row + size_t(h) * s.hs];
        for (int i = 0; i < h2; ++i) {
          const double a = (s.pos0 + t) * std::pow(double(kTheta), -2.0 * i / s.hs);
          const double x1 = v[i], x2 = v[i + h2];
          v[i] = x1 * std::cos(a) - x2 * std::sin(a);
          v[i + h2] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
  return x;
}

const Shape kShapes[] = {
    {1, 1, 1, 1, 2, 0}, {2, 5, 3, 1, 10, 0}, {1, 9, 4, 2, 6, 17}, {2, 3, 2, 2, 64, 1000}};

template <typename T>
void Check(const Shape& s, double fwd_tol, double bwd_tol) {
  SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH
                                    << " NKV=" << s.NKV << " hs=" << s.hs << " pos0=" << s.pos0);
  const std::vector<double> x = RoundTrip<T>(RandomVector(s.size(), 1));
  std::vector<T> xt = ToTyped<T>(x);
  RopeForward(xt.data(), s.B, s.T, s.NH, s.NKV, s.hs, kTheta, s.pos0);
  const std::vector<double> want = RopeRef(x, s);
  EXPECT_LE(MaxRelError(ToDouble(xt), want), fwd_tol);
  // Value heads pass through untouched.
  const int row = (s.NH + 2 * s.NKV) * s.hs;
  for (size_t r = 0; r < size_t(s.B) * s.T; ++r)
    for (int c = (s.NH + s.NKV) * s.hs; c < row; ++c)
      ASSERT_EQ(ToDouble(xt)[r * row + c], x[r * row + c]);

  const std::vector<double> R = RoundTrip<T>(RandomVector(s.size(), 2));
  std::vector<T> g = ToTyped<T>(R);
  RopeBackward(g.data(), s.B, s.T, s.NH, s.NKV, s.hs, kTheta, s.pos0);
  auto loss = [&](const std::vector<double>& v) {
    const std::vector<double> y = RopeRef(v, s);
    double L = 0;
    for (size_t i = 0; i < y.size(); ++i) L += y[i] * R[i];
    return L;
  };
  EXPECT_LE(MaxRelError(ToDouble(g), test::NumericalGradient(loss, x, 1e-6)), bwd_tol);
}

TEST(Rope, Fp32MatchesFloat64) {
  for (const Shape& s : kShapes) Check<float>(s, 1e-6, 1e-6);
}

// bf16: each rotated value is rounded once on store (2^-9 relative).
TEST(Rope, Bf16MatchesFloat64) {
  for (const Shape& s : kShapes) Check<bf16>(s, 8e-3, 8e-3);
}

// The angle table is kept between calls: a call whose positions differ from the last one's in
// pos0 alone (same T and head size: decoding, context-parallel chunks) must not reuse it.
TEST(Rope, EachCallRotatesByItsOwnPositions) {
  for (int pos0 : {0, 7, 0, 300, 300}) {
    const Shape s{2, 4, 2, 1, 8, pos0};
    SCOPED_TRACE(pos0);
    const std::vector<double> x = RandomVector(s.size(), pos0 + 3);
    std::vector<float> xt = ToTyped<float>(x);
    RopeForward(xt.data(), s.B, s.T, s.NH, s.NKV, s.hs, kTheta, s.pos0);
    EXPECT_LE(MaxRelError(ToDouble(xt), RopeRef(x, s)), 1e-6);
  }
}

}  // namespace
}  // namespace keel::kernels::cpu

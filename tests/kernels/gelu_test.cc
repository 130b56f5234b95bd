// GELU (tanh approximation): forward against a float64 reference, backward against float64 central
// differences of L = Σ out·R, and sane values far into both tails.
#include "keel/kernels/cpu/gelu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::MaxRelError;
using test::NumericalGradient;
using test::RandomVector;
using test::RoundTrip;
using test::ToDouble;
using test::ToTyped;

double GeluRef(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

std::vector<double> GeluRef(const std::vector<double>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = GeluRef(x[i]);
  return out;
}

// MaxRelError bounds. fp32: ExpApprox's ~2e-7 plus a few roundings (observed below 1e-6).
// bf16: out and dinp are stored in bf16, whose unit roundoff is 2^-8 ≈ 3.9e-3 (observed 3.1e-3);
// 8e-3 allows that rounding plus the fp32 arithmetic before it.
template <typename T>
struct Tolerance;
template <>
struct Tolerance<float> {
  static constexpr double kForward = 1e-5, kBackward = 1e-5;
};
template <>
struct Tolerance<bf16> {
  static constexpr double kForward = 8e-3, kBackward = 8e-3;
};

// n = 1 and sizes that are not multiples of the vector width; inputs spread over [-6, 6] so that
// both tails and the curved middle are exercised.
const size_t kSizes[] = {1, 7, 50, 1031};

template <typename T>
void CheckForward(size_t n) {
  SCOPED_TRACE(testing::Message() << "n=" << n);
  const std::vector<double> x = RoundTrip<T>(RandomVector(n, 31 + n, 2.0));
  std::vector<T> out(n);
  GeluForward(out.data(), ToTyped<T>(x).data(), n);
  EXPECT_LT(MaxRelError(ToDouble(out), GeluRef(x)), Tolerance<T>::kForward);
}

template <typename T>
void CheckBackward(size_t n) {
  SCOPED_TRACE(testing::Message() << "n=" << n);
  const std::vector<double> x = RoundTrip<T>(RandomVector(n, 41 + n, 2.0));
  const std::vector<double> r = RoundTrip<T>(RandomVector(n, 51 + n));
  // Poison dinp: backward must overwrite it, not add to it.
  std::vector<T> dinp(n, FromFloat<T>(1e3f));
  GeluBackward(dinp.data(), ToTyped<T>(x).data(), ToTyped<T>(r).data(), n);
  // GELU is elementwise, so dL/dx_i = r_i·gelu'(x_i): difference one element at a time rather than
  // the whole sum, which keeps the test linear in n.
  std::vector<double> numeric(n);
  for (size_t i = 0; i < n; ++i) {
    const auto loss = [&](const std::vector<double>& v) { return GeluRef(v[0]) * r[i]; };
    numeric[i] = NumericalGradient(loss, {x[i]})[0];
  }
  EXPECT_LT(MaxRelError(ToDouble(dinp), numeric), Tolerance<T>::kBackward);
}

TEST(Gelu, ForwardMatchesFloat64ReferenceF32) {
  for (size_t n : kSizes) CheckForward<float>(n);
}

TEST(Gelu, ForwardMatchesFloat64ReferenceBf16) {
  for (size_t n : kSizes) CheckForward<bf16>(n);
}

TEST(Gelu, BackwardMatchesFiniteDifferencesF32) {
  for (size_t n : kSizes) CheckBackward<float>(n);
}

TEST(Gelu, BackwardMatchesFiniteDifferencesBf16) {
  for (size_t n : kSizes) CheckBackward<bf16>(n);
}

// Pointwise over a dense grid, with an error bound per element (absolute near zero, relative
// elsewhere), so that a bad tail cannot hide behind the largest value; plus inputs beyond the
// range where exp over- or underflows.
TEST(Gelu, AccuratePointwiseAndFiniteInTheTails) {
  std::vector<float> x = {-1e4f, -200.0f, -90.0f, 0.0f, 90.0f, 200.0f, 1e4f};
  const size_t tails = x.size(), n = tails + 24 * 64 + 1;
  x.resize(n);
  for (size_t i = tails; i < n; ++i) x[i] = -12.0f + float(i - tails) / 64;  // steps of 1/64
  std::vector<float> out(n), dinp(n), ones(n, 1.0f);
  GeluForward(out.data(), x.data(), n);
  GeluBackward(dinp.data(), x.data(), ones.data(), n);
  for (size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(testing::Message() << "x=" << x[i]);
    ASSERT_TRUE(std::isfinite(out[i]) && std::isfinite(dinp[i]));
    const double ref = GeluRef(x[i]);
    EXPECT_NEAR(out[i], ref, 1e-6 * std::max(1.0, std::abs(ref)));
    const double h = 1e-4 * std::max(1.0, std::abs(double(x[i])));
    const double dref = (GeluRef(x[i] + h) - GeluRef(x[i] - h)) / (2 * h);
    EXPECT_NEAR(dinp[i], dref, 1e-5 * std::max(1.0, std::abs(dref)));
  }
}

}  // namespace
}  // namespace keel::kernels::cpu

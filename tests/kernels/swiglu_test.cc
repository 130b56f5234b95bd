// SwiGLU: forward against a float64 reference, backward against float64 central differences of
// L = Σ out·R, over gate values from deep negative to large positive.
#include "keel/kernels/cpu/swiglu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::MaxRelError;
using test::RandomVector;
using test::RoundTrip;
using test::ToDouble;
using test::ToTyped;

std::vector<double> SwigluRef(const std::vector<double>& gu, int N, int F) {
  std::vector<double> out(size_t(N) * F);
  for (int i = 0; i < N; ++i)
    for (int f = 0; f < F; ++f) {
      const double g = gu[size_t(i) * 2 * F + f], u = gu[size_t(i) * 2 * F + F + f];
      out[size_t(i) * F + f] = g / (1.0 + std::exp(-g)) * u;
    }
  return out;
}

template <typename T>
void Check(int N, int F, double fwd_tol, double bwd_tol) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " F=" << F);
  const std::vector<double> gu = RoundTrip<T>(RandomVector(size_t(N) * 2 * F, 1, 3.0));
  const std::vector<double> R = RoundTrip<T>(RandomVector(size_t(N) * F, 2));
  std::vector<T> gut = ToTyped<T>(gu), rt = ToTyped<T>(R), out(size_t(N) * F);
  // Poison: the backward must overwrite every element.
  std::vector<T> dgu(gu.size(), FromFloat<T>(std::numeric_limits<float>::quiet_NaN()));
  SwigluForward(out.data(), gut.data(), N, F);
  SwigluBackward(dgu.data(), gut.data(), rt.data(), N, F);
  EXPECT_LE(MaxRelError(ToDouble(out), SwigluRef(gu, N, F)), fwd_tol);
  auto loss = [&](const std::vector<double>& v) {
    const std::vector<double> y = SwigluRef(v, N, F);
    double L = 0;
    for (size_t i = 0; i < y.size(); ++i) L += y[i] * R[i];
    return L;
  };
  EXPECT_LE(MaxRelError(ToDouble(dgu), test::NumericalGradient(loss, gu, 1e-6)), bwd_tol);
}

TEST(Swiglu, Fp32MatchesFloat64) {
  for (auto [N, F] : {std::pair{1, 1}, {3, 7}, {17, 33}}) Check<float>(N, F, 1e-6, 1e-5);
}

TEST(Swiglu, Bf16MatchesFloat64) {
  for (auto [N, F] : {std::pair{3, 7}, {17, 33}}) Check<bf16>(N, F, 8e-3, 1e-2);
}

}  // namespace
}  // namespace keel::kernels::cpu

// RMSNorm: forward against a float64 reference, backward against float64 central differences of
// L = Σ out·R, the += rule of backward, and bitwise determinism of dweight across thread counts.
#include "keel/kernels/cpu/rmsnorm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/determinism.h"
#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::MaxRelError;
using test::RandomVector;
using test::RoundTrip;
using test::ToDouble;
using test::ToTyped;

constexpr float kEps = 1e-5f;

std::vector<double> RmsNormRef(const std::vector<double>& x, const std::vector<double>& w, int N,
                               int C) {
  std::vector<double> out(x.size());
  for (int i = 0; i < N; ++i) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[size_t(i) * C + c] * x[size_t(i) * C + c];
    const double r = 1.0 / std::sqrt(ss / C + double(kEps));
    for (int c = 0; c < C; ++c) out[size_t(i) * C + c] = x[size_t(i) * C + c] * r * w[c];
  }
  return out;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

struct Result {
  std::vector<double> out, dinp, dweight;
};

// Forward, then backward with dout = R into dinp = D0 and dweight = W0 (the += rule).
template <typename T>
Result RunRmsNorm(const std::vector<double>& x, const std::vector<double>& w,
                  const std::vector<double>& R, const std::vector<double>& D0,
                  const std::vector<float>& W0, int N, int C) {
  std::vector<T> xt = ToTyped<T>(x), wt = ToTyped<T>(w), rt = ToTyped<T>(R), dinp = ToTyped<T>(D0);
  std::vector<T> out(x.size());
  std::vector<float> rstd(N), dweight = W0;
  RmsNormForward(out.data(), rstd.data(), xt.data(), wt.data(), N, C, kEps);
  RmsNormBackward(dinp.data(), dweight.data(), rt.data(), xt.data(), wt.data(), rstd.data(), N, C);
  return {ToDouble(out), ToDouble(dinp), std::vector<double>(dweight.begin(), dweight.end())};
}

template <typename T>
void Check(int N, int C, double fwd_tol, double dinp_tol, double dw_tol) {
  SCOPED_TRACE(::testing::Message() << "N=" << N << " C=" << C);
  std::vector<double> x = RoundTrip<T>(RandomVector(size_t(N) * C, 1, 2.0));
  std::vector<double> w = RandomVector(C, 2, 0.3);
  for (double& v : w) v += 1.0;
  w = RoundTrip<T>(w);
  const std::vector<double> R = RoundTrip<T>(RandomVector(size_t(N) * C, 3));
  const std::vector<double> D0 = RoundTrip<T>(RandomVector(size_t(N) * C, 4, 0.1));
  const std::vector<float> W0(C, 0.25f);
  const Result r = RunRmsNorm<T>(x, w, R, D0, W0, N, C);
  EXPECT_LE(MaxRelError(r.out, RmsNormRef(x, w, N, C)), fwd_tol);

  auto wrt_x = [&](const std::vector<double>& v) { return Dot(RmsNormRef(v, w, N, C), R); };
  auto wrt_w = [&](const std::vector<double>& v) { return Dot(RmsNormRef(x, v, N, C), R); };
  std::vector<double> dx = test::NumericalGradient(wrt_x, x, 1e-6);
  std::vector<double> dw = test::NumericalGradient(wrt_w, w, 1e-6);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] += D0[i];  // dinp is added to
  for (size_t c = 0; c < dw.size(); ++c) dw[c] += W0[c];  // and so is dweight
  EXPECT_LE(MaxRelError(r.dinp, dx), dinp_tol);
  EXPECT_LE(MaxRelError(r.dweight, dw), dw_tol);
}

// fp32: ~1e-7 observed. bf16: outputs and dinp are stored in bf16 (2^-9 relative each); dweight is
// an fp32 sum of products of bf16 values.
TEST(RmsNorm, Fp32MatchesFloat64) {
  for (auto [N, C] : {std::pair{1, 1}, {7, 13}, {33, 64}, {300, 48}})
    Check<float>(N, C, 1e-5, 1e-5, 1e-5);
}

TEST(RmsNorm, Bf16MatchesFloat64) {
  for (auto [N, C] : {std::pair{7, 13}, {33, 64}}) Check<bf16>(N, C, 8e-3, 1.5e-2, 1e-3);
}

TEST(RmsNorm, WeightGradientIndependentOfThreadCount) {
  const int N = 517, C = 40;
  const std::vector<double> x = RandomVector(size_t(N) * C, 5), w = RandomVector(C, 6);
  const std::vector<double> R = RandomVector(size_t(N) * C, 7), D0(size_t(N) * C, 0.0);
  const std::vector<float> W0(C, 0.0f);
  Result one, two;
  {
    test::ScopedNumThreads t(1);
    one = RunRmsNorm<float>(x, w, R, D0, W0, N, C);
  }
  {
    test::ScopedNumThreads t(2);
    two = RunRmsNorm<float>(x, w, R, D0, W0, N, C);
  }
  EXPECT_TRUE(test::BitwiseEqual(one.dweight, two.dweight));
  EXPECT_TRUE(test::BitwiseEqual(one.dinp, two.dinp));
}

}  // namespace
}  // namespace keel::kernels::cpu

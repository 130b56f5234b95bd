// LayerNorm: forward against a float64 reference, backward against float64 central differences of
// L = Σ out·R, the += rule of backward, and determinism of the dweight/dbias row reduction.
#include "keel/kernels/cpu/layernorm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/determinism.h"
#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::BitwiseEqual;
using test::MaxRelError;
using test::NumericalGradient;
using test::RandomVector;
using test::RoundTrip;
using test::ScopedNumThreads;
using test::ToDouble;
using test::ToTyped;

std::vector<double> LayerNormRef(const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>& b, int N, int C) {
  std::vector<double> out(x.size());
  for (int i = 0; i < N; ++i) {
    const double* xi = &x[size_t(i) * C];
    double mean = 0, var = 0;
    for (int c = 0; c < C; ++c) mean += xi[c];
    mean /= C;
    for (int c = 0; c < C; ++c) var += (xi[c] - mean) * (xi[c] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C; ++c) out[size_t(i) * C + c] = (xi[c] - mean) * rstd * w[c] + b[c];
  }
  return out;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Tolerances, as MaxRelError (max abs error over max abs reference). fp32: observed ~1.5e-7, so
// 1e-5 leaves margin for other vector widths. bf16: outputs and dinp are stored in bf16 (unit
// roundoff 2^-8 ≈ 3.9e-3 each; observed up to 3.6e-3); dweight/dbias are fp32 sums of bf16 values
// whose products are exact in fp32, so they stay at fp32 accuracy (observed ~1.5e-7).
template <typename T>
struct Tolerance;
template <>
struct Tolerance<float> {
  static constexpr double kForward = 1e-5, kDinp = 1e-5, kDparam = 1e-5;
};
template <>
struct Tolerance<bf16> {
  static constexpr double kForward = 8e-3, kDinp = 1e-2, kDparam = 1e-5;
};

struct Inputs {
  std::vector<double> x, w, b, r;  // rounded to the kernel's T, so the reference sees what it sees
};

template <typename T>
Inputs MakeInputs(int N, int C, uint64_t seed) {
  // Weights around 1 and an offset in x, as in a trained model's residual stream.
  std::vector<double> x = RandomVector(size_t(N) * C, seed, 2.0);
  for (double& v : x) v += 0.5;
  std::vector<double> w = RandomVector(C, seed + 1, 0.3);
  for (double& v : w) v += 1.0;
  return {RoundTrip<T>(x), RoundTrip<T>(w), RoundTrip<T>(RandomVector(C, seed + 2, 0.5)),
          RoundTrip<T>(RandomVector(size_t(N) * C, seed + 3))};
}

template <typename T>
void CheckForward(int N, int C) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
  const Inputs in = MakeInputs<T>(N, C, 100 + N * 1000 + C);
  std::vector<T> out(size_t(N) * C);
  std::vector<float> mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), ToTyped<T>(in.x).data(),
                   ToTyped<T>(in.w).data(), ToTyped<T>(in.b).data(), N, C);
  EXPECT_LT(MaxRelError(ToDouble(out), LayerNormRef(in.x, in.w, in.b, N, C)),
            Tolerance<T>::kForward);
}

template <typename T>
void CheckBackward(int N, int C) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " C=" << C);
  const Inputs in = MakeInputs<T>(N, C, 200 + N * 1000 + C);
  const std::vector<T> x = ToTyped<T>(in.x), w = ToTyped<T>(in.w), b = ToTyped<T>(in.b);
  std::vector<T> out(size_t(N) * C), dinp(size_t(N) * C, FromFloat<T>(0.0f));
  std::vector<float> mean(N), rstd(N), dw(C, 0.0f), db(C, 0.0f);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), ToTyped<T>(in.r).data(), x.data(), w.data(),
                    mean.data(), rstd.data(), N, C);

  const auto loss_x = [&](const std::vector<double>& v) {
    return Dot(LayerNormRef(v, in.w, in.b, N, C), in.r);
  };
  const auto loss_w = [&](const std::vector<double>& v) {
    return Dot(LayerNormRef(in.x, v, in.b, N, C), in.r);
  };
  const auto loss_b = [&](const std::vector<double>& v) {
    return Dot(LayerNormRef(in.x, in.w, v, N, C), in.r);
  };
  EXPECT_LT(MaxRelError(ToDouble(dinp), NumericalGradient(loss_x, in.x)), Tolerance<T>::kDinp);
  EXPECT_LT(MaxRelError(ToDouble(dw), NumericalGradient(loss_w, in.w)), Tolerance<T>::kDparam);
  EXPECT_LT(MaxRelError(ToDouble(db), NumericalGradient(loss_b, in.b)), Tolerance<T>::kDparam);
}

// N=1; C=7, 50, 771 not multiples of the vector width; N=37 and N=300 cut into 5 and 32 row
// blocks for the dweight/dbias partials. C=1 has its own test below.
const int kShapes[][2] = {{1, 7}, {3, 7}, {5, 50}, {2, 771}, {37, 16}, {300, 9}};

TEST(LayerNorm, ForwardMatchesFloat64ReferenceF32) {
  for (const auto& s : kShapes) CheckForward<float>(s[0], s[1]);
}

TEST(LayerNorm, ForwardMatchesFloat64ReferenceBf16) {
  for (const auto& s : kShapes) CheckForward<bf16>(s[0], s[1]);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferencesF32) {
  for (const auto& s : kShapes) CheckBackward<float>(s[0], s[1]);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferencesBf16) {
  for (const auto& s : kShapes) CheckBackward<bf16>(s[0], s[1]);
}

// C=1: every row is its own mean, so out = bias and the true dinp and dweight are 0. The kernel's
// dinp is fp32 rounding noise of dn - mean(dn) times rstd = 1/√eps ≈ 316, hence the absolute bound.
TEST(LayerNorm, SingleChannelRowsGiveBiasAndZeroGradient) {
  const int N = 3, C = 1;
  const std::vector<float> x = {0.5f, -2.0f, 7.0f}, w = {1.3f}, b = {0.25f},
                           dout = {1.0f, -0.5f, 2.0f};
  std::vector<float> out(N), mean(N), rstd(N), dinp(N, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  for (int i = 0; i < N; ++i) {
    EXPECT_EQ(out[i], b[0]);
    EXPECT_NEAR(dinp[i], 0.0f, 1e-5f);
  }
  EXPECT_EQ(dw[0], 0.0f);
  EXPECT_FLOAT_EQ(db[0], 2.5f);
}

TEST(LayerNorm, ForwardSavesMeanAndRstd) {
  const int N = 4, C = 50;
  const Inputs in = MakeInputs<float>(N, C, 7);
  std::vector<float> out(size_t(N) * C), mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), ToTyped<float>(in.x).data(),
                   ToTyped<float>(in.w).data(), ToTyped<float>(in.b).data(), N, C);
  for (int i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += in.x[size_t(i) * C + c] / C;
    for (int c = 0; c < C; ++c) v += std::pow(in.x[size_t(i) * C + c] - m, 2) / C;
    EXPECT_NEAR(mean[i], m, 1e-6 * std::max(1.0, std::abs(m)));
    EXPECT_NEAR(rstd[i], 1 / std::sqrt(v + 1e-5), 1e-6 / std::sqrt(v + 1e-5));
  }
}

// Backward adds into dinp (the residual gradient), dweight and dbias rather than overwriting.
template <typename T>
void CheckBackwardAccumulates() {
  const int N = 6, C = 50;
  const Inputs in = MakeInputs<T>(N, C, 11);
  const std::vector<T> x = ToTyped<T>(in.x), w = ToTyped<T>(in.w), b = ToTyped<T>(in.b);
  const std::vector<T> dout = ToTyped<T>(in.r);
  std::vector<T> out(size_t(N) * C);
  std::vector<float> mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  const auto backward = [&](std::vector<T>& dinp, std::vector<float>& dw, std::vector<float>& db) {
    LayerNormBackward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                      mean.data(), rstd.data(), N, C);
  };
  std::vector<T> dinp_zero(size_t(N) * C, FromFloat<T>(0.0f));
  std::vector<float> dw_zero(C, 0.0f), db_zero(C, 0.0f);
  backward(dinp_zero, dw_zero, db_zero);

  const std::vector<double> dinp0 = RoundTrip<T>(RandomVector(size_t(N) * C, 12));
  const std::vector<double> dw0 = RandomVector(C, 13), db0 = RandomVector(C, 14);
  std::vector<T> dinp = ToTyped<T>(dinp0);
  std::vector<float> dw = ToTyped<float>(dw0), db = ToTyped<float>(db0);
  backward(dinp, dw, db);

  std::vector<double> expect_dinp(dinp0), expect_dw(dw0), expect_db(db0);
  for (size_t i = 0; i < expect_dinp.size(); ++i) expect_dinp[i] += ToFloat(dinp_zero[i]);
  for (int c = 0; c < C; ++c) expect_dw[c] += dw_zero[c];
  for (int c = 0; c < C; ++c) expect_db[c] += db_zero[c];
  // The kernel rounds D0 + G once into T; the expectation adds D0 to G already rounded into T. In
  // bf16 that is two roundings of unit roundoff 2^-8 ≈ 3.9e-3.
  const double tol = std::is_same_v<T, float> ? 1e-6 : 8e-3;
  EXPECT_LT(MaxRelError(ToDouble(dinp), expect_dinp), tol);
  EXPECT_LT(MaxRelError(ToDouble(dw), expect_dw), 1e-6);
  EXPECT_LT(MaxRelError(ToDouble(db), expect_db), 1e-6);
}

TEST(LayerNorm, BackwardAddsIntoDinpAndParamGradsF32) { CheckBackwardAccumulates<float>(); }

TEST(LayerNorm, BackwardAddsIntoDinpAndParamGradsBf16) { CheckBackwardAccumulates<bf16>(); }

// GPT-2 small's shape: B*T = 4*256 rows of C = 768. Runs backward on `threads` threads from zeroed
// gradients and returns dinp, dweight, dbias.
template <typename T>
std::vector<std::vector<float>> BackwardAtGpt2Shape(int threads) {
  const int N = 1024, C = 768;
  const Inputs in = MakeInputs<T>(N, C, 21);
  const std::vector<T> x = ToTyped<T>(in.x), w = ToTyped<T>(in.w), b = ToTyped<T>(in.b);
  std::vector<T> out(size_t(N) * C), dinp(size_t(N) * C, FromFloat<T>(0.0f));
  std::vector<float> mean(N), rstd(N), dw(C, 0.0f), db(C, 0.0f);
  ScopedNumThreads scoped(threads);
  LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), ToTyped<T>(in.r).data(), x.data(), w.data(),
                    mean.data(), rstd.data(), N, C);
  std::vector<float> dinp_f(dinp.size());
  for (size_t i = 0; i < dinp.size(); ++i) dinp_f[i] = ToFloat(dinp[i]);
  return {dinp_f, dw, db};
}

// The row blocks depend on N only, so the result is bitwise the same on every call and for every
// thread count — stronger than "equal within float reassociation".
template <typename T>
void CheckBackwardDeterministic() {
  const auto two = BackwardAtGpt2Shape<T>(2);
  for (int threads : {2, 1, 3}) {
    SCOPED_TRACE(testing::Message() << "threads=" << threads);
    const auto again = BackwardAtGpt2Shape<T>(threads);
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(BitwiseEqual(two[k], again[k])) << "output " << k;
  }
}

TEST(LayerNorm, BackwardIsBitwiseRepeatableAndThreadCountIndependentF32) {
  CheckBackwardDeterministic<float>();
}

TEST(LayerNorm, BackwardIsBitwiseRepeatableAndThreadCountIndependentBf16) {
  CheckBackwardDeterministic<bf16>();
}

}  // namespace
}  // namespace keel::kernels::cpu

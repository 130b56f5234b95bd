// AdamW: both overloads against a float64 scalar re-implementation of the formula in adamw.h over a
// few steps, and the bf16 overload's working copy as the rounded master.
#include "keel/kernels/cpu/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "keel/core/error.h"
#include "kernels/determinism.h"
#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::BitwiseEqual;
using test::MaxRelError;
using test::RandomVector;
using test::ToTyped;

struct StateRef {
  std::vector<double> master, m, v;
};

// The formula of adamw.h, in float64, one element at a time.
void AdamWRef(StateRef& s, const std::vector<double>& grad, const AdamWParams& p) {
  const double bc1 = 1 - std::pow(double(p.beta1), p.step);
  const double bc2 = 1 - std::pow(double(p.beta2), p.step);
  for (size_t i = 0; i < grad.size(); ++i) {
    const double g = grad[i] * p.grad_scale;
    s.m[i] = p.beta1 * s.m[i] + (1 - double(p.beta1)) * g;
    s.v[i] = p.beta2 * s.v[i] + (1 - double(p.beta2)) * g * g;
    const double m_hat = s.m[i] / bc1, v_hat = s.v[i] / bc2;
    s.master[i] -= p.lr * (m_hat / (std::sqrt(v_hat) + p.eps) + p.weight_decay * s.master[i]);
  }
}

// Not a multiple of the vector width.
constexpr size_t kN = 1031;
constexpr int kSteps = 5;

AdamWParams TestParams(int step) {
  AdamWParams p;
  p.lr = 0.05f;  // large, so that the moves dominate fp32 rounding of the master
  p.weight_decay = 0.1f;
  p.grad_scale = 0.5f;
  p.step = step;
  return p;
}

TEST(AdamW, MatchesFloat64ReferenceOverSeveralSteps) {
  const std::vector<double> master0 = test::RoundTrip<float>(RandomVector(kN, 1));
  StateRef ref{master0, std::vector<double>(kN, 0.0), std::vector<double>(kN, 0.0)};
  std::vector<float> master = ToTyped<float>(master0), m(kN, 0.0f), v(kN, 0.0f);
  for (int step = 1; step <= kSteps; ++step) {
    // Gradients of mixed scales, so that v̂ spans orders of magnitude.
    std::vector<double> grad = RandomVector(kN, 100 + step, 1.0);
    for (size_t i = 0; i < kN; i += 3) grad[i] *= 1e-3;
    const AdamWParams p = TestParams(step);
    AdamWUpdate(master.data(), m.data(), v.data(), ToTyped<float>(grad).data(), kN, p);
    AdamWRef(ref, test::RoundTrip<float>(grad), p);
  }
  // Compare the moves (master - master0), not the masters, so that the bound is on the update and
  // not hidden by the weights' own magnitude. Observed 1e-6: mostly fp32 rounding of the master
  // itself (ulp 2.4e-7 at |w| ≈ 3, five steps) against moves of up to ~0.25.
  std::vector<double> move(kN), move_ref(kN);
  for (size_t i = 0; i < kN; ++i) {
    move[i] = double(master[i]) - master0[i];
    move_ref[i] = ref.master[i] - master0[i];
  }
  EXPECT_LT(MaxRelError(move, move_ref), 1e-5);
  EXPECT_LT(MaxRelError(test::ToDouble(m), ref.m), 1e-6);
  EXPECT_LT(MaxRelError(test::ToDouble(v), ref.v), 1e-6);
}

// The bf16 overload does the fp32 overload's arithmetic and in addition writes the master, rounded
// to nearest even, into the working copy.
TEST(AdamW, Bf16OverloadUpdatesMasterLikeFp32AndRoundsItIntoWorkingCopy) {
  const std::vector<float> master0 = ToTyped<float>(RandomVector(kN, 2));
  std::vector<float> master_a = master0, m_a(kN, 0.0f), v_a(kN, 0.0f);
  std::vector<float> master_b = master0, m_b(kN, 0.0f), v_b(kN, 0.0f);
  std::vector<bf16> working(kN, ToBf16(0.0f));
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<float> grad = ToTyped<float>(RandomVector(kN, 200 + step));
    AdamWUpdate(master_a.data(), m_a.data(), v_a.data(), grad.data(), kN, TestParams(step));
    AdamWUpdate(master_b.data(), working.data(), m_b.data(), v_b.data(), grad.data(), kN,
                TestParams(step));
  }
  EXPECT_TRUE(BitwiseEqual(master_a, master_b));
  EXPECT_TRUE(BitwiseEqual(m_a, m_b));
  EXPECT_TRUE(BitwiseEqual(v_a, v_b));
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(working[i].bits, ToBf16(master_b[i]).bits) << i;
}

TEST(AdamW, RejectsStepZero) {
  float master = 1, m = 0, v = 0, grad = 1;
  EXPECT_THROW(AdamWUpdate(&master, &m, &v, &grad, 1, TestParams(0)), Error);
}

}  // namespace
}  // namespace keel::kernels::cpu

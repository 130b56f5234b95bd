// AdamW: both overloads against a float64 scalar re-implementation of the formula in adamw.h over a
// few steps, and the bf16 overload's working copy as the rounded master; bf16 moments and
// master-less weights (stochastic rounding): close to fp32, split-invariant, unbiased.
#include "keel/kernels/cpu/adamw.h"

#include <gtest/gtest.h>

#include <bit>
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

// bf16 moments (stochastically rounded): each step's m and v are within a bf16 ulp of the fp32
// state's, so after a few steps the moves agree to about bf16's resolution, not bitwise.
TEST(AdamW, Bf16MomentsTrackFp32Moments) {
  const std::vector<float> master0 = ToTyped<float>(RandomVector(kN, 3));
  std::vector<float> master_a = master0, m_a(kN, 0.0f), v_a(kN, 0.0f), master_b = master0;
  std::vector<bf16> m_b(kN, ToBf16(0.0f)), v_b(kN, ToBf16(0.0f));
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<float> grad = ToTyped<float>(RandomVector(kN, 300 + step));
    AdamWParams p = TestParams(step);
    AdamWUpdate(master_a.data(), m_a.data(), v_a.data(), grad.data(), kN, p);
    p.round_key = 42 + uint64_t(step);
    AdamWUpdate(AdamWState{master_b.data(), nullptr, m_b.data(), v_b.data(), true, grad.data()}, kN,
                p);
  }
  std::vector<double> move_a(kN), move_b(kN);
  for (size_t i = 0; i < kN; ++i) {
    move_a[i] = double(master_a[i]) - master0[i];
    move_b[i] = double(master_b[i]) - master0[i];
    ASSERT_NEAR(ToFloat(m_b[i]), m_a[i], 0.01) << i;  // m crosses zero: absolute
    ASSERT_NEAR(ToFloat(v_b[i]), v_a[i], 0.03 * v_a[i] + 1e-9) << i;
  }
  EXPECT_LT(MaxRelError(move_b, move_a), 0.05);
  EXPECT_GT(MaxRelError(move_b, move_a), 0.0);  // really bf16: not the fp32 state's bits
}

// The draws are a pure function of the key and index0 + i: one call over n equals two over the
// halves (a ZeRO shard's boundary), bitwise, and another key gives other bits.
TEST(AdamW, StochasticRoundingIsTheSameWhateverTheSplit) {
  const std::vector<float> grad = ToTyped<float>(RandomVector(kN, 7));
  const std::vector<bf16> w0 = ToTyped<bf16>(RandomVector(kN, 8));
  auto run = [&](uint64_t key, size_t cut) {
    std::vector<bf16> w = w0, m(kN, ToBf16(0.0f)), v(kN, ToBf16(0.0f));
    AdamWParams p = TestParams(1);
    p.round_key = key;
    for (auto [lo, hi] : {std::pair<size_t, size_t>{0, cut}, {cut, kN}}) {
      p.index0 = 1000 + lo;
      AdamWUpdate(
          AdamWState{nullptr, w.data() + lo, m.data() + lo, v.data() + lo, true, grad.data() + lo},
          hi - lo, p);
    }
    std::vector<uint16_t> bits;
    for (const auto* x : {&w, &m, &v})
      for (bf16 b : *x) bits.push_back(b.bits);
    return bits;
  };
  EXPECT_EQ(run(5, kN), run(5, 333));
  EXPECT_NE(run(5, kN), run(6, kN));
}

// Why the moments round stochastically: with beta2 = 0.999 and no gradient, v should decay by
// 0.1% a step, under bf16's half ulp (0.2%): rounded to nearest it would stay at 1 forever. Over
// many elements the stochastic v follows 0.999^t in expectation.
TEST(AdamW, Bf16SecondMomentDecaysInExpectation) {
  constexpr size_t n = 8192;
  constexpr int steps = 200;
  std::vector<float> master(n, 1.0f), grad(n, 0.0f);
  std::vector<bf16> m(n, ToBf16(0.0f)), v(n, ToBf16(1.0f));
  AdamWParams p = TestParams(1);
  p.beta2 = 0.999f;
  p.lr = 0;
  for (int t = 1; t <= steps; ++t) {
    p.step = t;
    p.round_key = uint64_t(t) * 0x9E3779B97F4A7C15ull;
    AdamWUpdate(AdamWState{master.data(), nullptr, m.data(), v.data(), true, grad.data()}, n, p);
  }
  double mean = 0;
  for (bf16 x : v) mean += ToFloat(x);
  mean /= n;
  const double want = std::pow(0.999, steps);  // 0.8186
  EXPECT_NEAR(mean, want, 0.005);
  // Round-to-nearest of the same recurrence never leaves 1.
  EXPECT_EQ(ToBf16(0.999f * 1.0f).bits, ToBf16(1.0f).bits);
}

// Without a master the bf16 weights take the update stochastically rounded: steps of 1e-4 (a
// twentieth of bf16's half ulp at 1) add up in expectation, where round-to-nearest loses them all.
TEST(AdamW, MasterlessWeightsAddUpTinyUpdatesInExpectation) {
  constexpr size_t n = 8192;
  constexpr int steps = 100;
  std::vector<bf16> w(n, ToBf16(1.0f));
  std::vector<float> m(n, 0.0f), v(n, 0.0f), grad(n, 1.0f);
  AdamWParams p = TestParams(1);
  p.lr = 1e-4f;
  p.weight_decay = 0;
  p.grad_scale = 1;
  for (int t = 1; t <= steps; ++t) {
    p.step = t;
    p.round_key = uint64_t(t) * 0xD1B54A32D192ED03ull;
    AdamWUpdate(AdamWState{nullptr, w.data(), m.data(), v.data(), false, grad.data()}, n, p);
  }
  double mean = 0;
  for (bf16 x : w) mean += ToFloat(x);
  mean /= n;
  // Adam's step with a constant gradient is lr·m̂/(√v̂ + eps) = lr each step.
  EXPECT_NEAR(mean, 1.0 - steps * 1e-4, 2e-4);
  EXPECT_EQ(ToBf16(1.0f - 1e-4f).bits, ToBf16(1.0f).bits);  // what round-to-nearest would keep
}

// bf16 gradients (optim.grad_dtype) are read widened, exactly: the update from them is bitwise the
// update from their fp32 widening, for every moment and weight kind, and their Σ g² the widened
// values' up to the order of an fp64 sum (across a block boundary too).
TEST(AdamW, Bf16GradientsAreTheirExactWidening) {
  const std::vector<bf16> g16 = ToTyped<bf16>(RandomVector(kN, 11));
  std::vector<float> g32(kN);
  for (size_t i = 0; i < kN; ++i) g32[i] = ToFloat(g16[i]);
  for (bool bf16_moments : {false, true})
    for (bool master : {true, false}) {
      auto run = [&](const void* grad, bool bf16_grads) {
        std::vector<float> w32 = ToTyped<float>(RandomVector(kN, 12)), m32(kN, 0.0f), v32(kN, 0.0f);
        std::vector<bf16> w16 = ToTyped<bf16>(RandomVector(kN, 12)), m16(kN, ToBf16(0.0f)),
                          v16(kN, ToBf16(0.0f));
        AdamWState s{master ? w32.data() : nullptr,
                     w16.data(),
                     bf16_moments ? static_cast<void*>(m16.data()) : m32.data(),
                     bf16_moments ? static_cast<void*>(v16.data()) : v32.data(),
                     bf16_moments,
                     grad,
                     bf16_grads};
        for (int step = 1; step <= 2; ++step) {
          AdamWParams p = TestParams(step);
          p.round_key = 7 + uint64_t(step);
          AdamWUpdate(s, kN, p);
        }
        std::vector<uint32_t> bits;
        for (float x : w32) bits.push_back(std::bit_cast<uint32_t>(x));
        for (const auto* x : {&w16, &m16, &v16})
          for (bf16 b : *x) bits.push_back(b.bits);
        for (const auto* x : {&m32, &v32})
          for (float f : *x) bits.push_back(std::bit_cast<uint32_t>(f));
        return bits;
      };
      EXPECT_EQ(run(g16.data(), true), run(g32.data(), false))
          << "bf16 moments " << bf16_moments << ", master " << master;
    }
  std::vector<bf16> big = ToTyped<bf16>(RandomVector((1 << 16) + 77, 13));
  std::vector<float> wide(big.size());
  for (size_t i = 0; i < big.size(); ++i) wide[i] = ToFloat(big[i]);
  // The same fp64 sum up to order: each dtype's loop vectorizes its own way (AVX2: the lanes add
  // in another order), and each is fixed whatever the thread count.
  const double want = SumSquares(wide.data(), wide.size());
  EXPECT_NEAR(SumSquares(big.data(), big.size()), want, 1e-12 * want);
}

TEST(AdamW, RejectsStepZero) {
  float master = 1, m = 0, v = 0, grad = 1;
  EXPECT_THROW(AdamWUpdate(&master, &m, &v, &grad, 1, TestParams(0)), Error);
}

}  // namespace
}  // namespace keel::kernels::cpu

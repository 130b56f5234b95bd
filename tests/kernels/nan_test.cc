// A NaN in a kernel's input (a corrupted activation, gradient or weight) must reach every output
// computed from it, and only those: the detectors (resilience/) look for it in the loss and the
// gradients' norm. Vector code drops NaN easily: x86's max and min return their second operand when
// either is NaN, and a clamp or select written for finite values turns NaN into a number (the
// classifier's exp did, 9736abe). Each kernel below gets a NaN at a position inside its vectors
// and one in the scalar tail; the attention's and the classifier's cases are in their own tests.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "keel/kernels/cpu/adamw.h"
#include "keel/kernels/cpu/gelu.h"
#include "keel/kernels/cpu/layernorm.h"
#include "keel/kernels/cpu/rmsnorm.h"
#include "keel/kernels/cpu/rope.h"
#include "keel/kernels/cpu/swiglu.h"
#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::RandomVector;
using test::ToTyped;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

template <typename T>
bool IsNan(T x) {
  return std::isnan(ToFloat(x));
}

// Positions inside the vectors (any width) and in the tail of 103 elements.
constexpr int kN = 103;
constexpr int kBad[] = {37, 101};

TEST(Nan, GeluReachesItsOwnElementOnly) {
  for (int bad : kBad) {
    std::vector<float> x = ToTyped<float>(RandomVector(kN, 1)), dout(kN, 1.0f);
    x[bad] = kNan;
    std::vector<float> out(kN), dx(kN);
    GeluForward(out.data(), x.data(), kN);
    GeluBackward(dx.data(), x.data(), dout.data(), kN);
    for (int i = 0; i < kN; ++i) {
      EXPECT_EQ(std::isnan(out[i]), i == bad) << "forward " << i << " bad " << bad;
      EXPECT_EQ(std::isnan(dx[i]), i == bad) << "backward " << i << " bad " << bad;
    }
  }
}

TEST(Nan, SwigluReachesItsOwnElementOnly) {
  const int N = 2, F = kN;  // gate_up rows: F gates then F ups
  for (int bad : kBad)
    for (bool in_gate : {true, false}) {
      std::vector<bf16> gu = ToTyped<bf16>(RandomVector(size_t(N) * 2 * F, 2));
      gu[size_t(F) * 2 + (in_gate ? 0 : F) + bad] = FromFloat<bf16>(kNan);  // row 1
      std::vector<bf16> out(size_t(N) * F), dout(size_t(N) * F, FromFloat<bf16>(1.0f));
      std::vector<bf16> dgu(gu.size());
      SwigluForward(out.data(), gu.data(), N, F);
      SwigluBackward(dgu.data(), gu.data(), dout.data(), N, F);
      for (int r = 0; r < N; ++r)
        for (int i = 0; i < F; ++i) {
          const bool hit = r == 1 && i == bad;
          EXPECT_EQ(IsNan(out[size_t(r) * F + i]), hit) << r << "," << i << " gate " << in_gate;
          // d gate = dout·u·s·(1 + g·(1 − s)) reads both; d up = dout·g·s reads the gate only.
          EXPECT_EQ(IsNan(dgu[size_t(r) * 2 * F + i]), hit) << "d gate " << r << "," << i;
          EXPECT_EQ(IsNan(dgu[size_t(r) * 2 * F + F + i]), hit && in_gate)
              << "d up " << r << "," << i << " gate " << in_gate;
        }
    }
}

// A norm mixes a row: a NaN anywhere in row 1 makes all of row 1 NaN, and leaves row 0 and row 2
// finite; in the backward the weight's and bias's gradients sum over rows, so they are NaN too.
TEST(Nan, LayerNormReachesItsRowAndTheWeightGradients) {
  const int N = 3, C = kN;
  for (int bad : kBad) {
    std::vector<float> x = ToTyped<float>(RandomVector(size_t(N) * C, 3));
    x[size_t(C) + bad] = kNan;
    std::vector<float> w = ToTyped<float>(RandomVector(C, 4)),
                       b = ToTyped<float>(RandomVector(C, 5));
    std::vector<float> out(x.size()), mean(N), rstd(N), dout(x.size(), 1.0f), dx(x.size(), 0.0f);
    std::vector<float> dw(C, 0.0f), db(C, 0.0f);
    LayerNormForward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    LayerNormBackward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                      rstd.data(), N, C);
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < C; ++c) {
        EXPECT_EQ(std::isnan(out[size_t(r) * C + c]), r == 1) << r << "," << c << " bad " << bad;
        EXPECT_EQ(std::isnan(dx[size_t(r) * C + c]), r == 1) << r << "," << c << " bad " << bad;
      }
    for (int c = 0; c < C; ++c) EXPECT_TRUE(std::isnan(dw[c])) << c << " bad " << bad;
    // dbias sums dout only: the NaN in x does not reach it.
    for (int c = 0; c < C; ++c) EXPECT_FALSE(std::isnan(db[c])) << c << " bad " << bad;
  }
}

TEST(Nan, RmsNormReachesItsRowAndTheWeightGradient) {
  const int N = 3, C = kN;
  for (int bad : kBad) {
    std::vector<bf16> x = ToTyped<bf16>(RandomVector(size_t(N) * C, 6));
    x[size_t(C) + bad] = FromFloat<bf16>(kNan);
    std::vector<bf16> w = ToTyped<bf16>(RandomVector(C, 7)), out(x.size());
    std::vector<bf16> dout(x.size(), FromFloat<bf16>(1.0f)), dx(x.size());
    std::vector<float> rstd(N), dw(C, 0.0f);
    RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
    RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
    for (int r = 0; r < N; ++r)
      for (int c = 0; c < C; ++c) {
        EXPECT_EQ(IsNan(out[size_t(r) * C + c]), r == 1) << r << "," << c << " bad " << bad;
        EXPECT_EQ(IsNan(dx[size_t(r) * C + c]), r == 1) << r << "," << c << " bad " << bad;
      }
    for (int c = 0; c < C; ++c) EXPECT_TRUE(std::isnan(dw[c])) << c << " bad " << bad;
  }
}

// RoPE mixes channel i with i + hs/2 of the same head vector, also at position 0 (where sin is 0,
// and 0·NaN is NaN): a NaN reaches its pair and nothing else, forward and backward.
TEST(Nan, RopeReachesItsChannelPairOnly) {
  const int T = 9, NH = 4, NKV = 2, hs = 40, row = (NH + 2 * NKV) * hs;
  for (int t_bad : {0, 7})
    for (int col : {hs + 3, NH * hs + hs / 2 + 17}) {  // query head 1's; key head 0's upper half
      const int partner = (col % hs) < hs / 2 ? col + hs / 2 : col - hs / 2;
      std::vector<float> x = ToTyped<float>(RandomVector(size_t(T) * row, 8));
      x[size_t(t_bad) * row + col] = kNan;
      for (bool backward : {false, true}) {
        std::vector<float> y = x;
        if (backward)
          RopeBackward(y.data(), 1, T, NH, NKV, hs, 10000.0f);
        else
          RopeForward(y.data(), 1, T, NH, NKV, hs, 10000.0f);
        for (int t = 0; t < T; ++t)
          for (int c = 0; c < row; ++c)
            EXPECT_EQ(std::isnan(y[size_t(t) * row + c]), t == t_bad && (c == col || c == partner))
                << "t " << t << " c " << c << " backward " << backward;
      }
    }
}

// The gradients' norm is where the trainer looks first: one NaN gradient must make it NaN.
TEST(Nan, SumSquaresOfAnyNanIsNan) {
  for (size_t bad :
       {size_t(5), size_t(70000), size_t(200002)}) {  // first, a later 2^16 block, tail
    std::vector<float> g(200003, 1e-3f);
    g[bad] = kNan;
    EXPECT_TRUE(std::isnan(SumSquares(g.data(), g.size()))) << bad;
    std::vector<bf16> h(g.size(), FromFloat<bf16>(1e-3f));
    h[bad] = FromFloat<bf16>(kNan);
    EXPECT_TRUE(std::isnan(SumSquares(h.data(), h.size()))) << bad;
  }
}

// AdamW, in each state tier: a NaN gradient makes its own weight NaN (what the next step's loss
// shows) and no other.
TEST(Nan, AdamWReachesItsOwnWeightOnly) {
  for (bool bf16_moments : {false, true})
    for (bool master : {true, false})
      for (int bad : kBad) {
        std::vector<float> grad(kN, 1e-3f), w32(kN, 0.5f), m32(kN, 0.0f), v32(kN, 0.0f);
        std::vector<bf16> working(kN, FromFloat<bf16>(0.5f)), m16(kN, FromFloat<bf16>(0.0f)),
            v16(kN, FromFloat<bf16>(0.0f));
        grad[bad] = kNan;
        AdamWState s;
        s.master = master ? w32.data() : nullptr;
        s.working = working.data();
        s.m = bf16_moments ? static_cast<void*>(m16.data()) : m32.data();
        s.v = bf16_moments ? static_cast<void*>(v16.data()) : v32.data();
        s.bf16_moments = bf16_moments;
        s.grad = grad.data();
        AdamWParams p;
        p.round_key = 1;
        AdamWUpdate(s, kN, p);
        for (int i = 0; i < kN; ++i)
          EXPECT_EQ(IsNan(working[i]), i == bad)
              << i << " bad " << bad << " bf16 moments " << bf16_moments << " master " << master;
      }
}

}  // namespace
}  // namespace keel::kernels::cpu

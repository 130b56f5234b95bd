// Token + position embedding: forward against a float64 reference, backward against float64 central
// differences of L = Σ out·R (with repeated tokens and a GPT-2-sized vocabulary), the += rule, and
// bitwise determinism across calls and thread counts.
#include "keel/kernels/cpu/encoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/determinism.h"
#include "kernels/fd_check.h"

namespace keel::kernels::cpu {
namespace {

using test::BitwiseEqual;
using test::MaxRelError;
using test::NumericalGradient;
using test::NumericalGradientAt;
using test::RandomVector;
using test::RoundTrip;
using test::ScopedNumThreads;
using test::ToDouble;
using test::ToTyped;

struct Shape {
  int B, T, C, V;
};

std::vector<double> EncoderRef(const std::vector<int32_t>& tokens, const std::vector<double>& wte,
                               const std::vector<double>& wpe, const Shape& s) {
  std::vector<double> out(size_t(s.B) * s.T * s.C);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int c = 0; c < s.C; ++c) {
        const size_t bt = size_t(b) * s.T + t;
        out[bt * s.C + c] = wte[size_t(tokens[bt]) * s.C + c] + wpe[size_t(t) * s.C + c];
      }
  return out;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Tokens from a small range, so that most of them repeat and dwte rows collect several additions.
std::vector<int32_t> RandomTokens(const Shape& s, int distinct, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, std::min(distinct, s.V) - 1);
  std::vector<int32_t> tokens(size_t(s.B) * s.T);
  for (auto& t : tokens) t = dist(gen);
  return tokens;
}

// B=T=C=V=1; C=7 and C=50 not multiples of the vector width (nor of the 16-channel split); V=1
// forces every token to repeat.
const Shape kShapes[] = {{1, 1, 1, 1}, {2, 3, 7, 5}, {3, 5, 50, 11}, {2, 4, 33, 1}};

// Forward is one addition rounded into T: exact for fp32 up to that rounding; bf16 unit roundoff
// is 2^-8. Backward accumulates fp32 sums of inputs exactly representable in fp32.
template <typename T>
double ForwardTolerance() {
  return std::is_same_v<T, float> ? 1e-7 : 4e-3;
}
constexpr double kBackwardTolerance = 1e-6;

template <typename T>
void CheckForward(const Shape& s) {
  SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V);
  const auto tokens = RandomTokens(s, s.V, 1);
  const auto wte = RoundTrip<T>(RandomVector(size_t(s.V) * s.C, 2));
  const auto wpe = RoundTrip<T>(RandomVector(size_t(s.T) * s.C, 3));
  std::vector<T> out(size_t(s.B) * s.T * s.C);
  EncoderForward(out.data(), tokens.data(), ToTyped<T>(wte).data(), ToTyped<T>(wpe).data(), s.B,
                 s.T, s.C);
  EXPECT_LT(MaxRelError(ToDouble(out), EncoderRef(tokens, wte, wpe, s)), ForwardTolerance<T>());
}

template <typename T>
void CheckBackward(const Shape& s) {
  SCOPED_TRACE(testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " V=" << s.V);
  const auto tokens = RandomTokens(s, s.V, 4);
  const auto wte = RandomVector(size_t(s.V) * s.C, 5);
  const auto wpe = RandomVector(size_t(s.T) * s.C, 6);
  const auto r = RoundTrip<T>(RandomVector(size_t(s.B) * s.T * s.C, 7));
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  EncoderBackward(dwte.data(), dwpe.data(), ToTyped<T>(r).data(), tokens.data(), s.B, s.T, s.C);
  const auto loss_wte = [&](const std::vector<double>& v) {
    return Dot(EncoderRef(tokens, v, wpe, s), r);
  };
  const auto loss_wpe = [&](const std::vector<double>& v) {
    return Dot(EncoderRef(tokens, wte, v, s), r);
  };
  EXPECT_LT(MaxRelError(ToDouble(dwte), NumericalGradient(loss_wte, wte)), kBackwardTolerance);
  EXPECT_LT(MaxRelError(ToDouble(dwpe), NumericalGradient(loss_wpe, wpe)), kBackwardTolerance);
}

TEST(Encoder, ForwardMatchesFloat64ReferenceF32) {
  for (const Shape& s : kShapes) CheckForward<float>(s);
}

TEST(Encoder, ForwardMatchesFloat64ReferenceBf16) {
  for (const Shape& s : kShapes) CheckForward<bf16>(s);
}

TEST(Encoder, BackwardMatchesFiniteDifferencesF32) {
  for (const Shape& s : kShapes) CheckBackward<float>(s);
}

TEST(Encoder, BackwardMatchesFiniteDifferencesBf16) {
  for (const Shape& s : kShapes) CheckBackward<bf16>(s);
}

// GPT-2's padded vocabulary (50257 rows) with a few tokens, including the first and last rows and a
// repeat: row offsets are computed in size_t, and rows no token names are left untouched. Only
// the named rows and a sample of the others are differenced (all 50257·C would take minutes).
TEST(Encoder, BackwardWithGpt2VocabularyTouchesOnlyNamedRows) {
  const Shape s{2, 3, 20, 50257};
  const std::vector<int32_t> tokens = {0, 50256, 17, 50256, 31337, 0};
  const auto wte = RandomVector(size_t(s.V) * s.C, 8);
  const auto wpe = RandomVector(size_t(s.T) * s.C, 9);
  const auto r = RandomVector(size_t(s.B) * s.T * s.C, 10);
  std::vector<float> out(r.size());
  EncoderForward(out.data(), tokens.data(), ToTyped<float>(wte).data(), ToTyped<float>(wpe).data(),
                 s.B, s.T, s.C);
  EXPECT_LT(MaxRelError(ToDouble(out), EncoderRef(tokens, wte, wpe, s)), 1e-7);

  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  EncoderBackward(dwte.data(), dwpe.data(), ToTyped<float>(r).data(), tokens.data(), s.B, s.T, s.C);
  std::vector<size_t> indices;
  for (int row : {0, 1, 17, 18, 31337, 50255, 50256})
    for (int c = 0; c < s.C; ++c) indices.push_back(size_t(row) * s.C + c);
  const auto loss = [&](const std::vector<double>& v) {
    return Dot(EncoderRef(tokens, v, wpe, s), r);
  };
  const auto numeric = NumericalGradientAt(loss, wte, indices);
  std::vector<double> analytic(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) analytic[k] = dwte[indices[k]];
  EXPECT_LT(MaxRelError(analytic, numeric), kBackwardTolerance);

  size_t touched = 0;
  for (float g : dwte) touched += g != 0.0f;
  EXPECT_EQ(touched, size_t(4 * s.C));  // rows 0, 17, 31337, 50256
}

// Backward adds into dwte/dwpe: running it on pre-filled gradients adds the same amounts.
TEST(Encoder, BackwardAddsIntoParamGrads) {
  const Shape s{3, 5, 50, 11};
  const auto tokens = RandomTokens(s, s.V, 11);
  const auto dout = ToTyped<bf16>(RandomVector(size_t(s.B) * s.T * s.C, 12));
  std::vector<float> dwte(size_t(s.V) * s.C, 0.0f), dwpe(size_t(s.T) * s.C, 0.0f);
  EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
  const auto dwte0 = RandomVector(dwte.size(), 13), dwpe0 = RandomVector(dwpe.size(), 14);
  std::vector<float> dwte_acc = ToTyped<float>(dwte0), dwpe_acc = ToTyped<float>(dwpe0);
  EncoderBackward(dwte_acc.data(), dwpe_acc.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
  std::vector<double> expect_wte(dwte0), expect_wpe(dwpe0);
  for (size_t i = 0; i < dwte.size(); ++i) expect_wte[i] += dwte[i];
  for (size_t i = 0; i < dwpe.size(); ++i) expect_wpe[i] += dwpe[i];
  // A sum of ~B·T/V fp32 additions per element.
  EXPECT_LT(MaxRelError(ToDouble(dwte_acc), expect_wte), 1e-6);
  EXPECT_LT(MaxRelError(ToDouble(dwpe_acc), expect_wpe), 1e-6);
}

// GPT-2's B, T, C with tokens from 100 values (so each dwte row gets ~40 additions), run on
// `threads` threads from zeroed gradients.
template <typename T>
std::vector<std::vector<float>> BackwardAtGpt2Shape(int threads) {
  const Shape s{4, 256, 768, 1000};
  const auto tokens = RandomTokens(s, 100, 15);
  const auto dout = ToTyped<T>(RandomVector(size_t(s.B) * s.T * s.C, 16));
  std::vector<float> dwte(size_t(s.V) * s.C, 0.0f), dwpe(size_t(s.T) * s.C, 0.0f);
  ScopedNumThreads scoped(threads);
  EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
  return {dwte, dwpe};
}

// Each thread owns channels and walks tokens in order, so the result is bitwise the same on every
// call and for every thread count.
template <typename T>
void CheckBackwardDeterministic() {
  const auto two = BackwardAtGpt2Shape<T>(2);
  for (int threads : {2, 1, 3}) {
    SCOPED_TRACE(testing::Message() << "threads=" << threads);
    const auto again = BackwardAtGpt2Shape<T>(threads);
    EXPECT_TRUE(BitwiseEqual(two[0], again[0])) << "dwte";
    EXPECT_TRUE(BitwiseEqual(two[1], again[1])) << "dwpe";
  }
}

TEST(Encoder, BackwardIsBitwiseRepeatableAndThreadCountIndependentF32) {
  CheckBackwardDeterministic<float>();
}

TEST(Encoder, BackwardIsBitwiseRepeatableAndThreadCountIndependentBf16) {
  CheckBackwardDeterministic<bf16>();
}

}  // namespace
}  // namespace keel::kernels::cpu

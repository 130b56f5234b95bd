// fp8 emulation (cpu/fp8.h) against core's definition (core/fp8.h): the vectorized rounding equals
// RoundFp8(x·s)/s on every bf16 value (all 65,536 bit patterns: normal, subnormal, the ties,
// saturation, infinities, NaN) at scales from 2^-20 to 2^20, in both formats, in place too; and
// AbsMax is the largest magnitude, NaN when one is NaN.
#include "keel/kernels/cpu/fp8.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "keel/core/fp8.h"

namespace keel::kernels::cpu {
namespace {

std::vector<bf16> EveryBf16() {
  std::vector<bf16> v(65536);
  for (uint32_t i = 0; i < v.size(); ++i) v[i] = std::bit_cast<bf16>(uint16_t(i));
  return v;
}

TEST(Fp8Round, EveryBf16ValueAsCoreRoundsIt) {
  const std::vector<bf16> in = EveryBf16();
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (int e = -20; e <= 20; e += 5) {
      const float s = std::ldexp(1.0f, e);
      std::vector<bf16> out(in.size());
      Fp8Round<bf16>(out.data(), in.data(), in.size(), s, f);
      int wrong = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        const float want = RoundFp8(ToFloat(in[i]) * s, f) / s;
        const float got = ToFloat(out[i]);
        const bool same = std::isnan(want) ? std::isnan(got)
                                           : std::bit_cast<uint32_t>(got) ==
                                                 std::bit_cast<uint32_t>(ToFloat(ToBf16(want)));
        if (!same && ++wrong <= 3)
          ADD_FAILURE() << Fp8FormatName(f) << " scale 2^" << e << ": " << ToFloat(in[i]) << " → "
                        << got << ", core says " << want;
      }
      EXPECT_EQ(wrong, 0) << Fp8FormatName(f) << " scale 2^" << e;
    }
  }
}

TEST(Fp8Round, Fp32InPlaceMatchesCore) {
  std::vector<float> x(4099);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float(std::sin(double(i)) * std::exp(double(i % 40) - 20.0));
  std::vector<float> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = RoundFp8(x[i] * 8.0f, Fp8Format::kE4M3) / 8.0f;
  Fp8Round<float>(x.data(), x.data(), x.size(), 8.0f, Fp8Format::kE4M3);
  EXPECT_EQ(x, want);
}

TEST(AbsMax, LargestMagnitudeAndNan) {
  std::vector<float> x(1001, 0.5f);
  x[17] = -3.25f;
  x[900] = 3.0f;
  EXPECT_EQ(AbsMax<float>(x.data(), x.size()), 3.25f);
  x[500] = INFINITY;
  EXPECT_EQ(AbsMax<float>(x.data(), x.size()), INFINITY);
  x[999] = NAN;
  EXPECT_TRUE(std::isnan(AbsMax<float>(x.data(), x.size())));
  std::vector<bf16> b = {ToBf16(-0.0f), ToBf16(1.5f), ToBf16(-2.5f)};
  EXPECT_EQ(AbsMax<bf16>(b.data(), b.size()), 2.5f);
  EXPECT_EQ(AbsMax<bf16>(b.data(), 0), 0.0f);
}

}  // namespace
}  // namespace keel::kernels::cpu

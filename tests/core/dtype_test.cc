// bf16 (core/dtype.h): round-to-nearest-even conversion against a reference that picks the nearer
// neighbour in double, the special values, the bulk conversions, and stochastic rounding, which
// is unbiased: over all 2^16 draws its mean is the input exactly.
#include "keel/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "keel/core/rng.h"

namespace keel {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint16_t Rne(uint32_t u) { return ToBf16(FromBits(u)).bits; }

// A bf16's value in double, with the pattern past the largest finite one (0x7f80, infinity) read
// as 2^128: the next step of the format, which round-to-nearest compares against.
double Value(uint32_t hi16) {
  if ((hi16 & 0x7fff) == 0x7f80) return std::ldexp(hi16 & 0x8000 ? -1.0 : 1.0, 128);
  return double(ToFloat(bf16{uint16_t(hi16)}));
}

// The nearer of the two bf16 neighbours of a finite float, ties to the even one.
uint16_t NearestEven(uint32_t u) {
  const uint32_t down = u >> 16, up = down + 1;
  const double x = double(FromBits(u)), a = std::fabs(x - Value(down)),
               b = std::fabs(Value(up) - x);
  if (a < b) return uint16_t(down);
  if (b < a) return uint16_t(up);
  return uint16_t(down % 2 == 0 ? down : up);
}

// Every bf16 pattern's finite floats at the cut's edges: just above it, below and at the halfway
// point, just above that, and just below the next pattern.
TEST(Bf16, RoundsToNearestEvenLikeAReference) {
  const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
  size_t checked = 0;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    if ((hi & 0x7f80) == 0x7f80) continue;  // Inf and NaN: below
    for (uint32_t lo : lows) {
      const uint32_t u = hi << 16 | lo;
      ASSERT_EQ(Rne(u), NearestEven(u)) << std::hex << u;
      ++checked;
    }
  }
  EXPECT_EQ(checked, (0x10000u - 2 * 0x80) * 6);
}

TEST(Bf16, TiesGoToTheEvenNeighbour) {
  // 1 + 2^-8 is halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): down.
  EXPECT_EQ(Rne(0x3f808000), 0x3f80);
  // Halfway between 0x3f81 (odd) and 0x3f82 (even): up.
  EXPECT_EQ(Rne(0x3f818000), 0x3f82);
  // Off the tie by one bit either way goes to the nearer.
  EXPECT_EQ(Rne(0x3f807fff), 0x3f80);
  EXPECT_EQ(Rne(0x3f808001), 0x3f81);
  // Negative values round their magnitude alike.
  EXPECT_EQ(Rne(0xbf808000), 0xbf80);
  EXPECT_EQ(Rne(0xbf818000), 0xbf82);
  EXPECT_EQ(Rne(0xbf80c000), 0xbf81);
  // Subnormals too: halfway above 0 goes to 0, halfway above the smallest subnormal goes up.
  EXPECT_EQ(Rne(0x00008000), 0x0000);
  EXPECT_EQ(Rne(0x00018000), 0x0002);
  EXPECT_EQ(Rne(0x80000000), 0x8000);  // -0 stays -0
}

TEST(Bf16, RoundingUpCarriesIntoTheNextExponent) {
  EXPECT_EQ(Rne(BitsOf(std::nextafter(2.0f, 0.0f))), 0x4000);  // 1.99999988 -> 2
  EXPECT_EQ(ToFloat(ToBf16(1.999f)), 2.0f);
  EXPECT_EQ(Rne(0x3fffc000), 0x4000);
  EXPECT_EQ(Rne(0xbfffffff), 0xc000);  // -1.99999988 -> -2
  EXPECT_EQ(Rne(0x007fffff), 0x0080);  // the largest subnormal -> the smallest normal
  // The largest finite float is past the largest bf16 by more than half a step: infinity.
  EXPECT_EQ(Rne(0x7f7fffff), 0x7f80);
  EXPECT_EQ(Rne(0xff7fffff), 0xff80);
  EXPECT_EQ(Rne(0x7f7f7fff), 0x7f7f);  // below the halfway point it stays finite
}

TEST(Bf16, NanStaysNanAndInfinityStaysInfinity) {
  EXPECT_EQ(Rne(0x7f800000), 0x7f80);
  EXPECT_EQ(Rne(0xff800000), 0xff80);
  // NaNs whose payload is in the low half only would become infinity by plain rounding, and
  // 0x7fffffff would carry into the sign: all stay (quiet) NaNs of their sign.
  for (uint32_t u :
       {0x7f800001u, 0x7f808000u, 0x7fc00000u, 0x7fffffffu, 0xff800001u, 0xffffffffu}) {
    const bf16 h = ToBf16(FromBits(u));
    EXPECT_TRUE(std::isnan(ToFloat(h))) << std::hex << u;
    EXPECT_EQ(h.bits & 0x8000, (u >> 16) & 0x8000) << std::hex << u;
  }
  EXPECT_TRUE(std::isnan(ToFloat(ToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(ToFloat(ToBf16(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());
}

TEST(Bf16, WideningIsExactAndRoundTrips) {
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    const float f = ToFloat(bf16{uint16_t(hi)});
    ASSERT_EQ(BitsOf(f), hi << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(ToBf16(f).bits, hi) << std::hex << hi;
    }
  }
}

// The bulk conversions (OpenMP simd, any length) give what the scalar ones give.
TEST(Bf16, BulkConversionsEqualTheScalarOnes) {
  std::vector<float> in;
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800001u, 0xff800000u, 0x80000000u,
                     0x00018000u, 0x3fffffffu})
    in.push_back(FromBits(u));
  const Philox rng(5, 0);
  for (int i = 0; i < 1000; ++i) in.push_back(FromBits(rng.Bits(uint64_t(i))[0]));
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(17), in.size()}) {
    std::vector<bf16> out(n);
    ConvertF32ToBf16(out.data(), in.data(), n);
    std::vector<float> back(n);
    ConvertBf16ToF32(back.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i].bits, ToBf16(in[i]).bits) << "n " << n << " i " << i;
      ASSERT_EQ(BitsOf(back[i]), uint32_t(out[i].bits) << 16) << "n " << n << " i " << i;
    }
  }
}

// Stochastic rounding gives one of the two neighbours, the upper with probability (the part below
// the cut) / 2^16: over all 2^16 draws the mean is the input exactly, for positive, negative,
// subnormal and exactly representable values.
TEST(Bf16, StochasticRoundingIsUnbiasedOverAllDraws) {
  for (uint32_t u : {0x3f800001u, 0x3f808000u, 0x3f80ffffu, 0x3f812345u, 0xbf812345u, 0x00001234u,
                     0x3fffffffu, 0x42c80000u, 0xc2c8abcdu}) {
    const uint32_t down = u >> 16, up = down + 1;
    double sum = 0;
    uint32_t ups = 0;
    for (uint32_t r = 0; r < 0x10000; ++r) {
      const uint16_t b = StochasticRoundBf16(FromBits(u), r).bits;
      ASSERT_TRUE(b == down || b == up) << std::hex << u << " draw " << r;
      ups += b == up;
      sum += double(ToFloat(bf16{b}));
    }
    EXPECT_EQ(ups, u & 0xffff) << std::hex << u;
    EXPECT_EQ(sum / 65536, double(FromBits(u))) << std::hex << u;
  }
  // Exactly representable values never move; only the low 16 bits of the draw count.
  for (uint32_t r : {0u, 1u, 0xffffu, 0x12345678u, 0xffffffffu})
    EXPECT_EQ(StochasticRoundBf16(1.5f, r).bits, 0x3fc0);
  EXPECT_EQ(StochasticRoundBf16(FromBits(0x3f800001), 0xffff0000u).bits, 0x3f80);
}

// With Philox draws, as the optimizer would use them: the mean of many roundings of a value that
// round-to-nearest always sends down converges on the value, and many tiny updates add up where
// round-to-nearest loses them all.
TEST(Bf16, StochasticRoundingWithPhiloxDrawsAddsUpTinyUpdates) {
  const Philox rng(17, 2);
  const float x = 1.0f + 1.0f / 512;  // a quarter of the way from 1 to the next bf16 (1 + 2^-7)
  ASSERT_EQ(ToFloat(ToBf16(x)), 1.0f);
  const int n = 100000;
  double sum = 0;
  for (int i = 0; i < n; ++i)
    sum += ToFloat(StochasticRoundBf16(x, rng.Bits(uint64_t(i))[0] & 0xffff));
  // Each draw is 1 or 1 + 2^-7 (p = 1/4): standard error 2^-7·sqrt(p(1-p)/n).
  EXPECT_NEAR(sum / n, double(x), 5 * std::ldexp(std::sqrt(0.1875 / n), -7));

  bf16 nearest = ToBf16(1.0f), stochastic = ToBf16(1.0f);
  const float step = 1.0f / 4096;  // a 32nd of bf16's spacing at 1
  for (int i = 0; i < 4096; ++i) {
    nearest = ToBf16(ToFloat(nearest) + step);
    stochastic = StochasticRoundBf16(ToFloat(stochastic) + step, rng.Bits(uint64_t(n + i))[1]);
  }
  EXPECT_EQ(ToFloat(nearest), 1.0f);  // every update lost
  // 4096 steps of 2^-12 add 1; each rounding adds a variance of p(1-p)·2^-14 (p = 1/32), about
  // 0.09² over all of them.
  EXPECT_NEAR(ToFloat(stochastic), 2.0f, 0.45f);
}

// NaN stays NaN and infinity stays infinity whatever the draw.
TEST(Bf16, StochasticRoundingKeepsNanAndInfinity) {
  for (uint32_t r : {0u, 0x8000u, 0xffffu}) {
    EXPECT_TRUE(std::isnan(ToFloat(StochasticRoundBf16(FromBits(0x7f800001), r))));
    EXPECT_TRUE(std::isnan(ToFloat(StochasticRoundBf16(FromBits(0xffffffff), r))));
    EXPECT_EQ(StochasticRoundBf16(FromBits(0x7f800000), r).bits, 0x7f80);
    EXPECT_EQ(StochasticRoundBf16(FromBits(0xff800000), r).bits, 0xff80);
  }
}

// fp16: every pattern widens to the value IEEE binary16 gives it (by its fields, in double), and
// rounding any float to fp16 picks the nearer of its two neighbours, ties to the even one,
// overflowing to infinity past 65520. The bit-level conversion (what nvcc's side compiles) and
// the compiler's _Float16 (what the kernels use) agree on every fp16 and a sweep of floats.
double F16Value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double sign = h & 0x8000 ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(m, -24);
  if (e == 31) return m ? std::nan("") : sign * HUGE_VAL;
  return sign * std::ldexp(1024 + m, e - 25);
}

TEST(Fp16, WideningGivesEveryPatternItsValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double want = F16Value(uint16_t(h));
    const float got = ToFloat(f16{uint16_t(h)});
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(double(got), want) << std::hex << h;
    ASSERT_EQ(ToF16(got).bits, h) << std::hex << h;  // and it rounds back to itself
  }
}

TEST(Fp16, RoundsToTheNearerNeighbourTiesToEven) {
  const Philox rng(5, 0);
  for (uint64_t i = 0; i < 2000000; ++i) {
    // Floats across fp16's range and past it, both signs: exponents 2^-30 .. 2^17.
    const auto w = rng.Bits(i);
    const uint32_t u = (w[0] & 0x807fffffu) | ((97u + w[1] % 48) << 23);
    const float x = FromBits(u);
    const uint16_t got = ToF16(x).bits;
    ASSERT_EQ(got, FloatToF16Bits(x).bits) << x;
    const double ax = std::fabs(double(x));
    if (ax >= 65520.0) {
      ASSERT_EQ(got & 0x7fff, 0x7c00) << x;  // infinity
      continue;
    }
    // The neighbours of |x| among the finite fp16 magnitudes.
    uint16_t lo = got & 0x7fff;
    if (F16Value(lo) > ax) --lo;
    const uint16_t hi = uint16_t(lo + 1);
    const double a = ax - F16Value(lo), b = F16Value(hi) - ax;
    const uint16_t want = a < b ? lo : b < a ? hi : (lo % 2 == 0 ? lo : hi);
    ASSERT_EQ(got & 0x7fff, want) << x;
    ASSERT_EQ(got >> 15, u >> 31) << x;
  }
}

TEST(Fp16, SpecialValuesAndBulkConversions) {
  EXPECT_EQ(ToF16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(ToF16(65519.99f).bits, 0x7bff);
  EXPECT_EQ(ToF16(65520.0f).bits, 0x7c00);  // the tie past the largest finite one: infinity
  EXPECT_EQ(ToF16(-1e10f).bits, 0xfc00);
  EXPECT_EQ(ToF16(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_TRUE(std::isnan(ToFloat(ToF16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(F16BitsToFloat(FloatToF16Bits(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(ToF16(std::ldexp(1.0f, -25)).bits, 0x0000);  // half the smallest subnormal: to even
  EXPECT_EQ(ToF16(std::ldexp(1.5f, -25)).bits, 0x0001);
  EXPECT_EQ(ToF16(std::ldexp(3.0f, -25)).bits, 0x0002);  // 1.5 ulps: the even one
  std::vector<float> x(1000), back(1000);
  std::vector<f16> h(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.37f - 150.0f;
  ConvertFromF32(DType::kF16, h.data(), x.data(), x.size());
  ConvertToF32(DType::kF16, back.data(), h.data(), h.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(h[i].bits, ToF16(x[i]).bits);
    ASSERT_EQ(back[i], ToFloat(ToF16(x[i])));
  }
}

}  // namespace
}  // namespace keel

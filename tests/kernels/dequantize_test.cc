// Dequantization (cpu/dequantize.h) against the definition, every code of both formats: int8
// codes -127..127 and NF4's 16 levels in both nibbles, groups of several sizes with a ragged last
// one, fp32 exactly and bf16 as the rounding of the fp32 value.
#include "keel/kernels/cpu/dequantize.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace keel::kernels::cpu {
namespace {

// Every code in turn, then a pattern, and each group's scale its own.
struct Case {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<double> want;
};

Case Make(QuantFormat f, size_t n, size_t group) {
  Case c;
  c.codes.resize(f == QuantFormat::kInt8 ? n : (n + 1) / 2);
  for (size_t i = 0; i < c.codes.size(); ++i) c.codes[i] = uint8_t((i * 37 + i / 256) % 256);
  if (f == QuantFormat::kInt8)
    for (uint8_t& b : c.codes)
      if (b == 128) b = 129;  // -128 is not a code (symmetric: -127..127)
  for (size_t g = 0; g < (n + group - 1) / group; ++g) c.scales.push_back(0.01f * float(g + 1));
  for (size_t i = 0; i < n; ++i) {
    const double s = c.scales[i / group];
    const double v = f == QuantFormat::kInt8
                         ? double(static_cast<int8_t>(c.codes[i]))
                         : double(kNf4Levels[(c.codes[i / 2] >> (4 * (i % 2))) & 15]);
    c.want.push_back(double(float(s * v)));
  }
  return c;
}

TEST(Dequantize, EveryCodeOfBothFormatsIsItsScaledValue) {
  for (QuantFormat f : {QuantFormat::kInt8, QuantFormat::kNf4})
    for (auto [n, group] : {std::pair<size_t, size_t>{64, 64}, {1000, 64}, {4096, 256}, {90, 30}}) {
      SCOPED_TRACE(::testing::Message() << (f == QuantFormat::kInt8 ? "int8" : "nf4") << " n=" << n
                                        << " group=" << group);
      const Case c = Make(f, n, group);
      std::vector<float> out(n);
      std::vector<bf16> half(n);
      Dequantize(out.data(), c.codes.data(), c.scales.data(), n, group, f);
      Dequantize(half.data(), c.codes.data(), c.scales.data(), n, group, f);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(double(out[i]), c.want[i]) << "element " << i;
        ASSERT_EQ(ToFloat(half[i]), ToFloat(ToBf16(float(c.want[i])))) << "element " << i;
      }
    }
}

}  // namespace
}  // namespace keel::kernels::cpu

#include "keel/core/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>

namespace keel {
namespace {

struct Spec {
  int mbits;  // mantissa bits
  int bias;   // exponent bias
  int emin;   // the smallest normal exponent, 1 - bias
  float max;  // the largest finite value
};

constexpr Spec SpecOf(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Spec{3, 7, -6, 448.0f} : Spec{2, 15, -14, 57344.0f};
}

}  // namespace

const char* Fp8FormatName(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

float Fp8Max(Fp8Format f) { return SpecOf(f).max; }

float RoundFp8(float x, Fp8Format f) {
  const Spec s = SpecOf(f);
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  float r;
  if (a > s.max) {
    r = s.max;
  } else if (a < std::ldexp(1.0f, s.emin)) {
    // Subnormal: a fixed quantum. a·2^k is exact, and nearbyint rounds half to even.
    const int k = s.mbits - s.emin;
    r = std::ldexp(std::nearbyint(std::ldexp(a, k)), -k);
  } else {
    // Normal: keep mbits of fp32's 23 mantissa bits, rounding half to even on the bits.
    const int shift = 23 - s.mbits;
    uint32_t u = std::bit_cast<uint32_t>(a);
    u += (1u << (shift - 1)) - 1 + ((u >> shift) & 1);
    u &= ~((1u << shift) - 1);
    r = std::min(std::bit_cast<float>(u), s.max);
  }
  return std::copysign(r, x);
}

uint8_t ToFp8(float x, Fp8Format f) {
  const Spec s = SpecOf(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  const float r = std::fabs(RoundFp8(x, f));
  if (r == 0) return sign;
  if (r < std::ldexp(1.0f, s.emin))
    return sign | uint8_t(std::ldexp(r, s.mbits - s.emin));  // exponent field 0
  int e = 0;
  const float m = std::frexp(r, &e);  // r = m·2^e, m in [0.5, 1)
  const int mant = int(std::ldexp(m, s.mbits + 1)) - (1 << s.mbits);
  return sign | uint8_t(((e - 1 + s.bias) << s.mbits) | mant);
}

float FromFp8(uint8_t code, Fp8Format f) {
  const Spec s = SpecOf(f);
  const int e = (code & 0x7F) >> s.mbits, mant = code & ((1 << s.mbits) - 1);
  const int top = (1 << (7 - s.mbits)) - 1;  // the all-ones exponent field
  float v;
  if (f == Fp8Format::kE4M3 && e == top && mant == (1 << s.mbits) - 1)
    v = std::nanf("");
  else if (f == Fp8Format::kE5M2 && e == top)
    v = mant == 0 ? INFINITY : std::nanf("");
  else if (e == 0)
    v = std::ldexp(float(mant), s.emin - s.mbits);
  else
    v = std::ldexp(float((1 << s.mbits) + mant), e - s.bias - s.mbits);
  return (code & 0x80) ? -v : v;
}

float Fp8Scale(float amax, Fp8Format f) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  int e = 0;
  std::frexp(double(SpecOf(f).max) / double(amax), &e);  // max/amax = m·2^e, m in [0.5, 1)
  return std::ldexp(1.0f, std::clamp(e - 1, -126, 126));
}

float Fp8Tracker::history_max() const {
  return history_.empty() ? 0.0f : *std::max_element(history_.begin(), history_.end());
}

float Fp8Tracker::Scale(float amax, bool observe) {
  // A NaN or infinity makes the step's amax +inf, which survives the ranks' max reduction, so
  // every rank that shares the tensor judges the overflow.
  if (observe) step_amax_ = std::isfinite(amax) ? std::max(step_amax_, amax) : INFINITY;
  // An all-zero history (zero gradients) says nothing about scale: this use's own amax does.
  const float h = recipe_.delayed ? history_max() : 0.0f;
  return Fp8Scale(h > 0 ? h : amax, format_);
}

void Fp8Tracker::Restore(const std::vector<float>& history) {
  history_.assign(history.begin(), history.end());
  while (int(history_.size()) > std::max(1, recipe_.history)) history_.pop_front();
  step_amax_ = 0;
}

std::string Fp8Tracker::EndStep(float amax) {
  std::string why;
  const float hmax = history_max();
  if (!std::isfinite(amax)) {
    why = "amax is not finite";
  } else if (recipe_.spike > 0 && int(history_.size()) >= recipe_.history && hmax > 0 &&
             double(amax) > recipe_.spike * hmax) {
    char text[160];
    std::snprintf(text, sizeof text, "amax %.4g is %.0fx the last %d steps' largest (%.4g)",
                  double(amax), double(amax) / hmax, recipe_.history, double(hmax));
    why = text;
  }
  if (std::isfinite(amax)) {
    history_.push_back(amax);
    while (int(history_.size()) > std::max(1, recipe_.history)) history_.pop_front();
  }
  step_amax_ = 0;
  return why;
}

}  // namespace keel

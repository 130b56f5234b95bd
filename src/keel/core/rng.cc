#include "keel/core/rng.h"

#include <cmath>

namespace keel {
namespace {

constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = uint64_t(a) * b;
  *hi = uint32_t(p >> 32);
  *lo = uint32_t(p);
}

float WordToUnit(uint32_t w) {
  // 24 random bits, offset by half a step: strictly inside (0, 1).
  return (float(w >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

}  // namespace

std::array<uint32_t, 4> Philox::Bits(uint64_t index) const {
  std::array<uint32_t, 4> c = {uint32_t(index), uint32_t(index >> 32), uint32_t(stream_),
                               uint32_t(stream_ >> 32)};
  uint32_t k0 = uint32_t(seed_), k1 = uint32_t(seed_ >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kMul0, c[0], &hi0, &lo0);
    MulHiLo(kMul1, c[2], &hi1, &lo1);
    c = {hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

float Philox::Uniform(uint64_t index) const { return WordToUnit(Bits(index)[0]); }

float Philox::Normal(uint64_t index) const {
  auto w = Bits(index);
  float u1 = WordToUnit(w[0]), u2 = WordToUnit(w[1]);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
}

}  // namespace keel

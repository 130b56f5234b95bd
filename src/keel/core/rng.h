// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011).
//
// A value is a pure function of (seed, stream, index): the same weights come out whatever the
// thread count, rank count or call order, and any slice of a stream can be drawn on its own
// (a rank can initialize only its shard).
//
//   keel::Philox rng(/*seed=*/42, /*stream=*/7);
//   float z = rng.Normal(i);   // the i-th standard normal of stream 7
#pragma once

#include <array>
#include <cstdint>

namespace keel {

class Philox {
 public:
  Philox(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

  // Four independent 32-bit words for counter `index`.
  std::array<uint32_t, 4> Bits(uint64_t index) const;

  // Uniform in (0, 1]: never 0, so that log() is safe. (Exactly 1 when the word's top 24 bits are
  // all ones, once in 2^24 draws: 1 - 2^-25 is not a float and rounds up.)
  float Uniform(uint64_t index) const;

  // Standard normal (Box-Muller over the first two words of counter `index`).
  float Normal(uint64_t index) const;

 private:
  uint64_t seed_;
  uint64_t stream_;
};

}  // namespace keel

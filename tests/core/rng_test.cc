// Philox4x32-10 (core/rng.h): the reference algorithm's known answers, and a value that is a
// function of (seed, stream, index) only, never of the order, chunking or threads that draw it.
#include "keel/core/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace keel {
namespace {

using Words = std::array<uint32_t, 4>;

// Random123's tests/kat_vectors, the three "philox4x32 10" lines: counter (4 words), key (2 words)
// and the expected output. keel's counter is (index low, index high, stream low, stream high) and
// its key (seed low, seed high).
TEST(Philox, MatchesTheReferenceKnownAnswers) {
  struct Kat {
    Words ctr;
    std::array<uint32_t, 2> key;
    Words want;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const uint64_t index = uint64_t(k.ctr[1]) << 32 | k.ctr[0];
    const uint64_t stream = uint64_t(k.ctr[3]) << 32 | k.ctr[2];
    const uint64_t seed = uint64_t(k.key[1]) << 32 | k.key[0];
    EXPECT_EQ(Philox(seed, stream).Bits(index), k.want) << std::hex << index;
  }
}

std::vector<Words> Draw(uint64_t seed, uint64_t stream, const std::vector<uint64_t>& indices) {
  const Philox rng(seed, stream);
  std::vector<Words> out;
  for (uint64_t i : indices) out.push_back(rng.Bits(i));
  return out;
}

// The same triple gives the same value from any generator object, whatever was drawn before it
// and in whatever order the indices are visited.
TEST(Philox, AValueDependsOnSeedStreamAndIndexOnly) {
  const size_t n = 4096;
  std::vector<uint64_t> forward(n);
  std::iota(forward.begin(), forward.end(), uint64_t(1) << 40);
  const std::vector<Words> want = Draw(42, 7, forward);

  std::vector<uint64_t> order = forward;
  std::reverse(order.begin(), order.end());
  std::vector<Words> got = Draw(42, 7, order);
  std::reverse(got.begin(), got.end());
  EXPECT_EQ(got, want);

  std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  got = Draw(42, 7, order);
  const Philox rng(42, 7);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], rng.Bits(order[i])) << i;
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(want[size_t(order[i] - forward[0])], got[i]) << "shuffled draw " << i;

  // Other streams drawn in between change nothing.
  const Philox a(42, 7), other(42, 8);
  std::vector<Words> interleaved;
  for (uint64_t i : forward) {
    (void)other.Bits(i);
    interleaved.push_back(a.Bits(i));
  }
  EXPECT_EQ(interleaved, want);
}

// Any chunking over any number of threads fills a buffer with the same values.
TEST(Philox, ChunksAndThreadsDrawTheSameValues) {
  const size_t n = 10007;  // prime: chunks of unequal size
  auto fill = [&](int threads) {
    std::vector<float> out(n);
    std::vector<std::thread> pool;
    const size_t per = (n + size_t(threads) - 1) / size_t(threads);
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const Philox rng(2024, 3);  // each thread its own generator
        for (size_t i = size_t(t) * per; i < std::min(n, size_t(t + 1) * per); ++i)
          out[i] = rng.Normal(i);
      });
    for (auto& th : pool) th.join();
    return out;
  };
  const std::vector<float> one = fill(1);
  for (int threads : {2, 3, 7, 16}) {
    const std::vector<float> many = fill(threads);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&one[i], &many[i], 4), 0) << threads << " threads, index " << i;
  }
}

// Neighbouring streams, seeds and indices, including those that differ only in the high 32 bits
// of the 64-bit stream, seed or index, give unrelated words.
TEST(Philox, StreamsSeedsAndIndicesDiffer) {
  const uint64_t hi = uint64_t(1) << 32;
  const std::pair<Philox, Philox> pairs[] = {
      {Philox(1, 0), Philox(1, 1)},  {Philox(1, 5), Philox(1, 5 + hi)},
      {Philox(0, 5), Philox(1, 5)},  {Philox(9, 5), Philox(9 + hi, 5)},
      {Philox(0, 0), Philox(hi, 0)},
  };
  const size_t n = 2000;
  for (size_t p = 0; p < std::size(pairs); ++p) {
    size_t same_words = 0;
    for (size_t i = 0; i < n; ++i) {
      const Words a = pairs[p].first.Bits(i), b = pairs[p].second.Bits(i);
      for (int w = 0; w < 4; ++w) same_words += a[size_t(w)] == b[size_t(w)];
    }
    EXPECT_LE(same_words, 1u) << "pair " << p;  // 8000 words: a chance match is ~2e-6
  }
  // Counters that differ only in the index's high word.
  const Philox rng(3, 3);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_NE(rng.Bits(i), rng.Bits(i + hi)) << i;
}

// Uniform is never 0 (log is safe) and at most 1, with the moments of U(0, 1); Normal has mean 0
// and variance 1.
TEST(Philox, UniformAndNormalHaveTheirDistributions) {
  const Philox rng(11, 1);
  const int n = 200000;
  double su = 0, su2 = 0, sn = 0, sn2 = 0;
  float lo = 1, hi = 0;
  for (int i = 0; i < n; ++i) {
    const float u = rng.Uniform(uint64_t(i));
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    su += u;
    su2 += double(u) * u;
    const float z = rng.Normal(uint64_t(i));
    ASSERT_TRUE(std::isfinite(z)) << i;
    sn += z;
    sn2 += double(z) * z;
  }
  EXPECT_GT(lo, 0.0f);
  EXPECT_LE(hi, 1.0f);
  EXPECT_LT(lo, 1e-4f);
  EXPECT_GT(hi, 1 - 1e-4f);
  // Five standard errors: 1/sqrt(12 n) for the uniform mean, 1/sqrt(n) for the normal's.
  EXPECT_NEAR(su / n, 0.5, 5 / std::sqrt(12.0 * n));
  EXPECT_NEAR(su2 / n - (su / n) * (su / n), 1.0 / 12, 0.002);
  EXPECT_NEAR(sn / n, 0.0, 5 / std::sqrt(double(n)));
  EXPECT_NEAR(sn2 / n, 1.0, 5 * std::sqrt(2.0 / n));
}

}  // namespace
}  // namespace keel

// The checkpoint hashes (ckpt/manifest.h) run through libxxhash's AVX2/AVX-512 dispatch: they must
// give the plain xxh3's values, whole or a slice at a time, and leave no dirty upper vector state
// behind (Debian's 0.8.1 AVX-512 hash does, and every legacy-SSE instruction after it then ran up
// to 37x slower: keel's x86-64-v2 code, libm).
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <random>
#include <vector>

#include "keel/ckpt/manifest.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace keel::ckpt {
namespace {

std::vector<uint8_t> RandomBytes(size_t n) {
  std::mt19937_64 rng(7);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(rng());
  return b;
}

TEST(HashStream, GivesThePlainXxh3WholeAndBySlices) {
  const std::vector<uint8_t> b = RandomBytes(size_t(3) << 20);
  for (size_t n : {size_t(0), size_t(1), size_t(17), size_t(240), size_t(241), size_t(4096),
                   size_t(1) << 20, b.size()}) {
    EXPECT_EQ(Hash(b.data(), n), XXH3_64bits(b.data(), n)) << n;
    for (uint64_t seed : {uint64_t(0), uint64_t(0x9e3779b97f4a7c15)}) {
      HashStream s(seed);
      // Uneven slices, as a transfer cuts them.
      for (size_t off = 0; off < n;) {
        const size_t k = std::min(n - off, size_t(1000003));
        s.Update(b.data() + off, k);
        off += k;
      }
      EXPECT_EQ(s.Digest(), XXH3_64bits_withSeed(b.data(), n, seed)) << n << " seed " << seed;
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("xsave"))) uint64_t XinUse() { return _xgetbv(1); }
#endif

TEST(HashStream, LeavesTheUpperVectorStateClean) {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  // XGETBV with ECX = 1 (XINUSE) needs OSXSAVE and CPUID.(0xD, 1).EAX[2].
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX) ||
      !__get_cpuid_count(0xD, 1, &a, &b, &c, &d) || !(a & 4))
    GTEST_SKIP() << "this CPU reports no XINUSE (XGETBV 1) or no AVX: nothing to leave dirty";
  // XINUSE bit 2: the upper halves of ymm0-15; bit 6: the upper halves of zmm0-15. Either set
  // makes legacy-SSE instructions pay a transition penalty.
  constexpr uint64_t kUpper = (1u << 2) | (1u << 6);
  const std::vector<uint8_t> bytes = RandomBytes(size_t(4) << 20);
  EXPECT_NE(Hash(bytes.data(), bytes.size()), 0u);
  EXPECT_EQ(XinUse() & kUpper, 0u) << "after Hash";
  EXPECT_NE(PieceHash(bytes.data(), bytes.size(), "wte.weight", "master", {0, 0}, {4, 4}), 0u);
  EXPECT_EQ(XinUse() & kUpper, 0u) << "after PieceHash";
  HashStream s;
  s.Update(bytes.data(), bytes.size());
  EXPECT_EQ(XinUse() & kUpper, 0u) << "after HashStream::Update";
#else
  GTEST_SKIP() << "not an x86-64 CPU";
#endif
}

}  // namespace
}  // namespace keel::ckpt

// The batch loader: the shuffle is a bijection per epoch, epochs differ, and data-parallel ranks
// split each global batch into disjoint parts whose union is the single-process batch.
#include "keel/data/loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "keel/core/error.h"

namespace keel::data {
namespace {

TEST(Permutation, IsABijectionForManySizes) {
  for (uint64_t n : {1ull, 2ull, 3ull, 7ull, 64ull, 1000ull, 4097ull}) {
    Permutation p(n, 42, 0);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t j = p(i);
      ASSERT_LT(j, n);
      ASSERT_FALSE(seen[j]) << "n=" << n << " i=" << i;
      seen[j] = true;
    }
  }
}

TEST(Permutation, DiffersBetweenEpochsAndSeeds) {
  const uint64_t n = 1000;
  Permutation a(n, 1, 0), b(n, 1, 1), c(n, 2, 0);
  int same_ab = 0, same_ac = 0;
  for (uint64_t i = 0; i < n; ++i) {
    same_ab += a(i) == b(i);
    same_ac += a(i) == c(i);
  }
  EXPECT_LT(same_ab, 20);
  EXPECT_LT(same_ac, 20);
}

// A flat token file whose token i is i mod 50000, so a window's first token names its start.
std::string MakeTokens(size_t n) {
  auto path = std::filesystem::temp_directory_path() / "keel_loader_test.u16";
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = uint16_t(i % 50000);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char*>(t.data()), n * 2);
  return path.string();
}

TEST(BatchLoader, RanksSplitEachGlobalBatchDisjointly) {
  const int T = 8, GB = 12;
  auto ds = TokenDataset::Open(MakeTokens(8 * 50 + 1));  // 50 samples: batches cross epochs
  for (int step = 0; step < 10; ++step) {
    std::vector<int32_t> want(size_t(GB) * T), tgt(want.size());
    BatchLoader one(ds, T, GB, 0, 1, 7, true);
    one.Fill(step, 0, GB, want.data(), tgt.data());
    for (int world : {2, 3, 4}) {
      std::vector<int32_t> got;
      for (int r = 0; r < world; ++r) {
        BatchLoader l(ds, T, GB, r, world, 7, true);
        const int local = GB / world;
        for (int micro = 0; micro < 2 && local % 2 == 0; ++micro) {
          std::vector<int32_t> tok(size_t(local / 2) * T), t2(tok.size());
          l.Fill(step, micro, local / 2, tok.data(), t2.data());
          got.insert(got.end(), tok.begin(), tok.end());
        }
        if (local % 2 != 0) {
          std::vector<int32_t> tok(size_t(local) * T), t2(tok.size());
          l.Fill(step, 0, local, tok.data(), t2.data());
          got.insert(got.end(), tok.begin(), tok.end());
        }
      }
      EXPECT_EQ(got, want) << "world " << world << " step " << step;
    }
  }
}

TEST(BatchLoader, EveryEpochSeesEverySampleOnceAndTargetsAreShifted) {
  const int T = 4, n = 30;
  auto ds = TokenDataset::Open(MakeTokens(size_t(T) * n + 1));
  BatchLoader l(ds, T, /*global_batch=*/5, 0, 1, 3, true);
  ASSERT_EQ(l.samples_per_epoch(), uint64_t(n));
  std::vector<int> epoch0, epoch1;
  for (int step = 0; step < 12; ++step) {
    std::vector<int32_t> tok(5 * T), tgt(5 * T);
    l.Fill(step, 0, 5, tok.data(), tgt.data());
    for (int b = 0; b < 5; ++b) {
      for (int t = 0; t < T; ++t) ASSERT_EQ(tgt[b * T + t], tok[b * T + t] + 1);
      (step < 6 ? epoch0 : epoch1).push_back(tok[b * T] / T);
    }
  }
  EXPECT_EQ(std::set<int>(epoch0.begin(), epoch0.end()).size(), size_t(n));
  EXPECT_EQ(std::set<int>(epoch1.begin(), epoch1.end()).size(), size_t(n));
  EXPECT_NE(epoch0, epoch1);
}

// A flat uint16 file of n tokens, all in [base, base + 1000): two such files with disjoint ranges
// let a window's first token say which source it came from.
std::string MakeSourceTokens(const std::string& name, size_t n, uint16_t base) {
  auto path = std::filesystem::temp_directory_path() / name;
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = uint16_t(base + i % 1000);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char*>(t.data()), n * 2);
  return path.string();
}

TEST(BatchLoader, BlendRealizesTheWeightsAndSplitsOverRanks) {
  const int T = 8, GB = 12, kSteps = 40;
  auto a = TokenDataset::Open(MakeSourceTokens("keel_blend_a.u16", 8 * 37 + 1, 0));
  auto b = TokenDataset::Open(MakeSourceTokens("keel_blend_b.u16", 8 * 23 + 1, 20000));
  const std::vector<const TokenDataset*> sources = {&a, &b};
  const std::vector<double> weights = {0.7, 0.3};

  // One rank: every prefix of the sequence holds each source within 1 of weight × N.
  BatchLoader one(sources, weights, T, GB, 0, 1, 7);
  std::vector<int32_t> seq;
  std::vector<int32_t> tok(size_t(GB) * T), tgt(tok.size());
  for (int step = 0; step < kSteps; ++step) {
    one.Next(GB, tok.data(), tgt.data());
    seq.insert(seq.end(), tok.begin(), tok.end());
    for (int i = 0; i < GB; ++i) ASSERT_EQ(tgt[size_t(i) * T], tok[size_t(i) * T + 1]);
  }
  int from_a = 0;
  for (size_t n = 1; n <= seq.size() / T; ++n) {
    const int32_t first = seq[(n - 1) * T];
    ASSERT_TRUE(first < 1000 || (first >= 20000 && first < 21000)) << first;
    from_a += first < 1000;
    EXPECT_LT(std::abs(from_a - 0.7 * double(n)), 1.0) << "after " << n << " samples";
    EXPECT_LT(std::abs(int(n) - from_a - 0.3 * double(n)), 1.0) << "after " << n << " samples";
  }

  // Two ranks, each its own loader: the union of their parts, step by step, is the sequence.
  std::vector<int32_t> got;
  BatchLoader r0(sources, weights, T, GB, 0, 2, 7), r1(sources, weights, T, GB, 1, 2, 7);
  std::vector<int32_t> half(size_t(GB / 4) * T), h2(half.size());
  for (int step = 0; step < kSteps; ++step)
    for (BatchLoader* l : {&r0, &r1})
      for (int micro = 0; micro < 2; ++micro) {
        l->Next(GB / 4, half.data(), h2.data());
        got.insert(got.end(), half.begin(), half.end());
      }
  EXPECT_EQ(got, seq);

  // The state names the blend; a state of another blend or of one dataset does not restore.
  LoaderState st = one.state();
  EXPECT_EQ(st.weights, weights);
  EXPECT_EQ(st.source_tokens, (std::vector<uint64_t>{a.size(), b.size()}));
  EXPECT_EQ(LoaderStateFromJson(ToJson(st)), st);
  BatchLoader again(sources, weights, T, GB, 0, 1, 7);
  again.restore(st);
  EXPECT_EQ(again.state(), st);
  BatchLoader other(sources, {0.5, 0.5}, T, GB, 0, 1, 7);
  EXPECT_THROW(other.restore(st), Error);
  BatchLoader single(a, T, GB, 0, 1, 7, true);
  EXPECT_THROW(single.restore(st), Error);
  EXPECT_THROW(again.restore(single.state()), Error);
}

}  // namespace
}  // namespace keel::data

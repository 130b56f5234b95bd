// Rows of a loss-masked dataset: packed by document (a row starts at a document, holds the whole
// documents that fit, truncates one longer than T + 1, pads the rest), targets the mask excludes
// are -1, and the step's count of trained targets is the same for every rank split. Plain
// datasets keep their stream windows.
#include "keel/data/windows.h"

#include <gtest/gtest.h>

#include <vector>

#include "data/temp_dir.h"
#include "keel/data/blend.h"
#include "keel/data/loader.h"
#include "keel/data/prefetcher.h"
#include "keel/data/shard_writer.h"

namespace keel::data {
namespace {

// Token i is 100 + i; it is trained on when i % 3 != 0. Documents of the given lengths, written
// into shards of about 8 tokens (packing crosses shard boundaries).
std::string MaskedDataset(const TempDir& tmp, const std::vector<int>& lens) {
  ShardWriterOptions o;
  o.vocab_size = 1000;
  o.eos_id = 999;
  o.shard_tokens = 8;
  o.masked = true;
  ShardWriter w(tmp / "masked", o);
  int i = 0;
  for (int len : lens) {
    std::vector<int32_t> t;
    std::vector<uint8_t> m;
    for (int k = 0; k < len; ++k, ++i) {
      t.push_back(100 + i);
      m.push_back(uint8_t(i % 3 != 0));
    }
    w.AddDocument(t, m);
  }
  w.Finish();
  return tmp / "masked";
}

int32_t Expected(int i) { return i % 3 != 0 ? 100 + i : -1; }

TEST(SampleWindows, PacksWholeDocumentsTruncatesLongOnesAndMasksTargets) {
  TempDir tmp;
  const int T = 5;  // windows of 6 tokens
  const TokenDataset ds = TokenDataset::Open(MaskedDataset(tmp, {3, 2, 10, 4, 5, 1}));
  SampleWindows w(ds, T);
  // [d0 d1] (5 tokens), d2's first 6 of 10, [d3] (d4 does not fit after it), [d4 d5] (6).
  const std::vector<std::pair<int, int>> spans = {{0, 5}, {5, 6}, {15, 4}, {19, 6}};
  ASSERT_EQ(w.count(), spans.size());
  std::vector<int32_t> tok(T), tgt(T);
  for (size_t k = 0; k < spans.size(); ++k) {
    const auto [start, len] = spans[k];
    const int scored = w.Read(k, tok.data(), tgt.data());
    int want_scored = 0;
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(tok[size_t(t)], t < len ? 100 + start + t : 999) << "window " << k << " t " << t;
      const int32_t want = t + 1 < len ? Expected(start + t + 1) : -1;  // padding: no target
      EXPECT_EQ(tgt[size_t(t)], want) << "window " << k << " t " << t;
      want_scored += want >= 0;
    }
    EXPECT_EQ(scored, want_scored) << "window " << k;
    EXPECT_EQ(w.Scored(k), want_scored) << "window " << k;
  }
}

TEST(SampleWindows, PlainDataKeepsItsStreamWindows) {
  TempDir tmp;
  ShardWriterOptions o;
  o.vocab_size = 1000;
  o.eos_id = 999;
  ShardWriter sw(tmp / "plain", o);
  std::vector<int32_t> t(25);
  for (int i = 0; i < 25; ++i) t[size_t(i)] = i;
  sw.AddDocument(t);
  sw.Finish();
  const TokenDataset ds = TokenDataset::Open(tmp / "plain");
  SampleWindows w(ds, 4);
  ASSERT_FALSE(w.masked());
  ASSERT_EQ(w.count(), 6u);  // (26 - 1) / 4: the document's eos is token 25
  std::vector<int32_t> tok(4), tgt(4);
  EXPECT_EQ(w.Read(2, tok.data(), tgt.data()), 4);
  EXPECT_EQ(tok, (std::vector<int32_t>{8, 9, 10, 11}));
  EXPECT_EQ(tgt, (std::vector<int32_t>{9, 10, 11, 12}));
}

TEST(SampleWindows, StepScoredIsTheSameForEveryRankSplitAndMatchesTheRows) {
  TempDir tmp;
  std::vector<int> lens;
  for (int d = 0; d < 40; ++d) lens.push_back(1 + (d * 7) % 11);
  const TokenDataset ds = TokenDataset::Open(MaskedDataset(tmp, lens));
  const int T = 8, GB = 4;
  for (int step = 0; step < 6; ++step) {
    uint64_t counted = 0, want = 0;
    for (int world : {1, 2, 4}) {
      uint64_t seen = 0;
      for (int r = 0; r < world; ++r) {
        BatchLoader l(ds, T, GB, r, world, /*seed=*/5, /*shuffle=*/true);
        LoaderState st = l.state();
        st.position = uint64_t(step) * GB;
        l.restore(st);
        const uint64_t n = l.StepScored();
        if (world == 1) want = n;
        EXPECT_EQ(n, want) << "step " << step << " rank " << r << " of " << world;
        std::vector<int32_t> tok(size_t(GB / world) * T), tgt(tok.size());
        l.Next(GB / world, tok.data(), tgt.data());
        for (int32_t y : tgt) seen += y >= 0;
      }
      EXPECT_EQ(seen, want) << "step " << step << " world " << world;
      counted += seen;
    }
    EXPECT_GT(counted, 0u);
  }
  // Through the prefetcher, which hands the count over before the step's first micro-batch.
  BatchLoader l(ds, T, GB, 0, 1, 5, true);
  uint64_t want = 0;
  {
    BatchLoader ref(ds, T, GB, 0, 1, 5, true);
    want = ref.StepScored();
  }
  Prefetcher pf(l, 2, 3);
  uint64_t got = 0;
  pf.StepScored(&got);
  EXPECT_EQ(got, want);
  std::vector<int32_t> tok(2 * T), tgt(tok.size());
  uint64_t seen = 0;
  for (int k = 0; k < 2; ++k) {
    pf.Next(tok.data(), tgt.data());
    for (int32_t y : tgt) seen += y >= 0;
  }
  EXPECT_EQ(seen, want);
}

TEST(SampleWindows, BlendsMaskedAndPlainSources) {
  TempDir tmp;
  const TokenDataset masked = TokenDataset::Open(MaskedDataset(tmp, {3, 4, 5, 6, 2, 3}));
  ShardWriterOptions o;
  o.vocab_size = 1000;
  o.eos_id = 999;
  ShardWriter sw(tmp / "plain", o);
  std::vector<int32_t> t(40, 7);
  sw.AddDocument(t);
  sw.Finish();
  const TokenDataset plain = TokenDataset::Open(tmp / "plain");
  BlendedSamples blend({&masked, &plain}, {0.5, 0.5}, 4, 3);
  EXPECT_TRUE(blend.masked());
  std::vector<int32_t> tok(4), tgt(4);
  int masked_rows = 0;
  for (uint64_t g = 0; g < 20; ++g) {
    const int scored = blend.Read(g, tok.data(), tgt.data());
    EXPECT_EQ(scored, blend.Scored(g));
    if (blend.Resolve(g).source == 1) {
      EXPECT_EQ(scored, 4);
    } else {
      ++masked_rows;
      EXPECT_LE(scored, 4);
      for (int i = 0; i < 4; ++i) {
        if (tgt[size_t(i)] >= 0) EXPECT_NE((tgt[size_t(i)] - 100) % 3, 0);
      }
    }
  }
  EXPECT_GT(masked_rows, 0);
}

}  // namespace
}  // namespace keel::data

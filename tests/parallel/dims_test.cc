// Tests of the layout types (parallel/dims.h, parallel/layout.h): rank numbering with tp
// innermost, the ZeRO shard ranges, and Layout::Validate's one-line messages.
#include "keel/parallel/dims.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/layout.h"

namespace keel::parallel {
namespace {

TEST(Dims, CoordsAndRankOfRoundTripWithTpInnermost) {
  const ParallelDims d{/*dp=*/2, /*tp=*/2, /*pp=*/2, /*zero=*/0};
  ASSERT_EQ(d.world(), 8);
  // Rank 5 = 1*4 + 0*2 + 1: pp 1, dp 0, tp 1.
  RankCoords c = Coords(d, 5);
  EXPECT_EQ(c.pp, 1);
  EXPECT_EQ(c.dp, 0);
  EXPECT_EQ(c.tp, 1);
  // Neighbouring ranks share a tensor-parallel group.
  EXPECT_EQ(Coords(d, 0).tp, 0);
  EXPECT_EQ(Coords(d, 1).tp, 1);
  EXPECT_EQ(Coords(d, 1).dp, 0);
  EXPECT_EQ(Coords(d, 2).dp, 1);
  for (int rank = 0; rank < d.world(); ++rank) {
    RankCoords rc = Coords(d, rank);
    EXPECT_GE(rc.dp, 0);
    EXPECT_LT(rc.dp, d.dp);
    EXPECT_LT(rc.tp, d.tp);
    EXPECT_LT(rc.pp, d.pp);
    EXPECT_EQ(RankOf(d, rc), rank);
  }
  const ParallelDims odd{/*dp=*/3, /*tp=*/1, /*pp=*/2, /*zero=*/1};
  for (int rank = 0; rank < odd.world(); ++rank) EXPECT_EQ(RankOf(odd, Coords(odd, rank)), rank);
}

TEST(Dims, ShardSlicesAreCeilSizedAndTheLastMayBeShortOrEmpty) {
  std::vector<size_t> sizes;
  size_t next = 0;
  for (int r = 0; r < 4; ++r) {
    ShardRange s = Shard(10, 4, r);
    EXPECT_EQ(s.size, 3u);
    EXPECT_EQ(s.lo, next);
    next = s.hi;
    sizes.push_back(s.numel());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{3, 3, 3, 1}));
  EXPECT_EQ(next, 10u);

  // Fewer elements than ranks: the last ranks own nothing but allocate the same buffer.
  sizes.clear();
  for (int r = 0; r < 4; ++r) {
    ShardRange s = Shard(2, 4, r);
    EXPECT_EQ(s.size, 1u);
    EXPECT_LE(s.hi, 2u);
    sizes.push_back(s.numel());
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{1, 1, 0, 0}));

  ShardRange whole = Shard(7, 1, 0);
  EXPECT_EQ(whole.lo, 0u);
  EXPECT_EQ(whole.hi, 7u);
  EXPECT_EQ(whole.size, 7u);
}

TEST(Dims, NameForLogs) { EXPECT_EQ(DimsName(ParallelDims{2, 1, 1, 3}), "dp=2 tp=1 pp=1 zero=3"); }

// The layout of dims d with `micro_batch` sequences per micro-batch.
Layout Of(const ParallelDims& d, int micro_batch = 1) {
  Layout l;
  static_cast<ParallelDims&>(l) = d;
  l.micro_batch = micro_batch;
  return l;
}

std::string BadInput(const Layout& l, const LayoutInputs& in,
                     const std::string& prefix = "[parallel] ") {
  try {
    l.Validate(in, prefix);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a keel::Error";
  return "";
}

TEST(Dims, ValidateGivesOneLineWithTheNumbers) {
  const LayoutInputs gpt2{
      .world = 4, .n_head = 12, .n_layer = 12, .padded_vocab = 50304, .global_batch = 16};
  EXPECT_NO_THROW(Of({4, 1, 1, 3}, 4).Validate(gpt2));
  EXPECT_NO_THROW(Of({1, 4, 1, 0}, 4).Validate(gpt2));
  EXPECT_NO_THROW(Of({1, 1, 1, 0}).Validate(LayoutInputs{}));  // nothing given: nothing checked

  EXPECT_EQ(BadInput(Of({1, 0, 1, 0}), {}), "[parallel] tp=0: expected an integer >= 1");
  EXPECT_EQ(BadInput(Of({1, 1, -1, 0}), {}), "[parallel] pp=-1: expected an integer >= 1");
  EXPECT_EQ(BadInput(Of({0, 1, 1, 0}), {}), "[parallel] dp=0: expected an integer >= 1");
  EXPECT_EQ(BadInput(Of({1, 1, 1, 4}), {}), "[parallel] zero=4: expected 0, 1, 2 or 3");
  EXPECT_EQ(BadInput(Of({1, 4, 1, 0}), {.world = 6}),
            "[parallel] tp=4 x pp=1 x dp=1 = 4 does not match the 6 ranks launched");
  EXPECT_EQ(BadInput(Of({1, 5, 1, 0}), {.world = 5, .n_head = 12}),
            "[parallel] tp=5 does not divide model.n_head=12 (each rank holds whole heads)");
  EXPECT_NE(BadInput(Of({1, 3, 1, 0}), {.world = 3, .n_head = 12, .padded_vocab = 50304 + 128})
                .find("tp=3 does not divide model.vocab_size padded to 50432"),
            std::string::npos);
  EXPECT_EQ(BadInput(Of({1, 1, 5, 0}), {.world = 5, .n_layer = 12}),
            "[parallel] pp=5 does not divide model.n_layer=12 (each stage holds whole layers)");
  EXPECT_EQ(BadInput(Of({4, 1, 1, 0}), {.world = 4, .global_batch = 10}),
            "[parallel] global batch 10 is not divisible by dp=4 x micro-batch 1 = 4");
  EXPECT_EQ(BadInput(Of({4, 1, 1, 0}, 3), {.global_batch = 16}, "plan: "),
            "plan: global batch 16 is not divisible by dp=4 x micro-batch 3 = 12");
}

}  // namespace
}  // namespace keel::parallel

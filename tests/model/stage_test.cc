// Pipeline stages' parameter layouts and their split of the blocks.
#include <gtest/gtest.h>

#include <numeric>

#include "keel/model/params.h"

namespace keel::model {
namespace {

TEST(Stages, BalancedSplitGivesTheLastStageFewerBlocksForTheClassifier) {
  // GPT-2 124M at T = 256: the classifier (2·50304·768 FLOPs per token) is ~5.3 blocks' worth.
  // 9 + 3 puts max(9, 3 + 5.3) blocks on a stage; 8 + 4 would put 9.3, the equal 6 + 6 11.3.
  const ModelConfig gpt2 = NamedConfig("gpt2");
  EXPECT_EQ(BalancedStageLayers(gpt2, 256, 2), (std::vector<int>{9, 3}));
  // The tiny test model's classifier outweighs all its blocks: one block on the last stage.
  ModelConfig tiny = NamedConfig("gpt2-tiny");
  tiny.n_layer = 4;
  EXPECT_EQ(BalancedStageLayers(tiny, 32, 2), (std::vector<int>{3, 1}));
  for (int pp : {1, 2, 3, 4, 6, 12}) {
    const std::vector<int> l = BalancedStageLayers(gpt2, 1024, pp);
    ASSERT_EQ(int(l.size()), pp);
    EXPECT_EQ(std::accumulate(l.begin(), l.end(), 0), 12);
    for (int n : l) EXPECT_GE(n, 1);
  }
}

TEST(Stages, UnevenStagesCoverTheModelOnceAndKeepWholeModelNames) {
  ModelConfig cfg = NamedConfig("gpt2-tiny");
  cfg.n_layer = 4;
  const ParamLayout whole = ParamLayout::Whole(cfg);
  const std::vector<int> split = {3, 1};
  size_t held = 0;
  for (int s = 0; s < 2; ++s) {
    const StageRange st = StageOf(cfg, split, s);
    const ParamLayout stage = ParamLayout::Stage(cfg, st);
    EXPECT_EQ(st.layers(), split[size_t(s)]);
    for (const ParamInfo& p : stage.params()) {
      EXPECT_EQ(p.stream, size_t(&whole.Find(p.name) - whole.params().data())) << p.name;
      if (!p.replica) held += p.numel;
    }
    EXPECT_EQ(stage.holds_first(), s == 0);
    EXPECT_EQ(stage.holds_last(), s == 1);
  }
  EXPECT_EQ(held, whole.total());  // every tensor once, the last stage's wte copy aside
  EXPECT_TRUE(ParamLayout::Stage(cfg, StageOf(cfg, split, 1)).Find("wte.weight").replica);
}

// The state's sizes without building a table per layer equal the built layout's, field by field,
// for every rank's chunks: GPT-2 (tied wte: its replica on the last stage) and a Llama (untied
// lm_head, grouped key/value heads), whole, in pipeline stages equal, uneven and interleaved, and
// tensor-parallel shards; and they still scale with the depth where a layout would be too large.
TEST(Stages, StateShapeWithoutTheLayoutEqualsTheLayouts) {
  auto same = [](const parallel::StateShape& a, const parallel::StateShape& b) {
    EXPECT_EQ(a.total, b.total);
    EXPECT_EQ(a.n_bias, b.n_bias);
    EXPECT_EQ(a.embed, b.embed);
    EXPECT_EQ(a.final_norm, b.final_norm);
    EXPECT_EQ(a.max_block, b.max_block);
    EXPECT_EQ(a.working_bytes, b.working_bytes);
  };
  int checked = 0;
  for (const char* name : {"gpt2-mini", "llama-mini"}) {
    ModelConfig cfg = NamedConfig(name);
    cfg.n_layer = 8;
    for (DType dt : {DType::kBF16, DType::kF32})
      for (int tp : {1, 2})
        for (auto [pp, v] : {std::pair{1, 1}, {2, 1}, {4, 1}, {2, 2}, {2, 4}, {4, 2}})
          for (int stage = 0; stage < pp; ++stage)
            for (int r = 0; r < tp; ++r) {
              SCOPED_TRACE(std::string(name) + " tp " + std::to_string(tp) + " rank " +
                           std::to_string(r) + " pp " + std::to_string(pp) + " v " +
                           std::to_string(v) + " stage " + std::to_string(stage));
              const std::vector<StageRange> chunks = RankChunks(cfg, pp, stage, v);
              EXPECT_EQ(int(chunks.size()), pp > 1 ? v : 1);
              same(StateShapeOf(cfg, chunks, {tp, r}, dt),
                   StateShapeOf(ParamLayout::Stage(cfg, chunks, {tp, r}), dt));
              ++checked;
            }
    for (int s = 0; s < 3; ++s) {
      const std::vector<StageRange> uneven = RankChunks(cfg, 3, s, 1, {5, 2, 1});
      ASSERT_EQ(uneven.size(), 1u);
      EXPECT_EQ(uneven[0].layers(), std::vector<int>({5, 2, 1})[size_t(s)]);
      same(StateShapeOf(cfg, uneven, {}, DType::kBF16),
           StateShapeOf(ParamLayout::Stage(cfg, uneven), DType::kBF16));
    }
  }
  EXPECT_EQ(checked, 2 * 2 * 3 * 15);  // models x dtypes x tp ranks x (pp, v) stages
  // 10⁸ layers: each one more block adds one block's parameters.
  ModelConfig deep = NamedConfig("gpt2-mini");
  const size_t per_block = StateShapeOf(ParamLayout::Whole(deep), DType::kF32).max_block;
  const parallel::StateShape one = StateShapeOf(deep, {WholeModel(deep)}, {}, DType::kF32);
  deep.n_layer = 100000000;
  const parallel::StateShape huge = StateShapeOf(deep, {WholeModel(deep)}, {}, DType::kF32);
  EXPECT_EQ(huge.total - one.total,
            size_t(100000000 - NamedConfig("gpt2-mini").n_layer) * per_block);
  EXPECT_EQ(huge.max_block, per_block);
}

}  // namespace
}  // namespace keel::model

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

}  // namespace
}  // namespace keel::model

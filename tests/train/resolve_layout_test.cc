// The layout a run resolves (train/config.h's ResolveLayout): dp derived from the ranks launched,
// and each impossible layout (ranks, ZeRO stage, tp against heads and vocabulary, sequence and
// pipeline parallelism's conditions) refused with one line naming the keys and numbers.
#include <gtest/gtest.h>

#include "../bad_input.h"
#include "keel/core/error.h"
#include "keel/model/params.h"
#include "keel/train/config.h"

namespace keel::train {
namespace {

TEST(ResolveLayout, DpIsDerivedFromTheRanksLaunched) {
  RunConfig cfg;  // gpt2-mini, batch_size 8
  EXPECT_EQ(ResolveLayout(cfg, 1), (parallel::ParallelDims{1, 1, 1, 0}));
  EXPECT_EQ(ResolveLayout(cfg, 4), (parallel::ParallelDims{4, 1, 1, 0}));
  cfg.parallel.zero = 2;
  EXPECT_EQ(ResolveLayout(cfg, 2), (parallel::ParallelDims{2, 1, 1, 2}));
  cfg.parallel.dp = 2;  // explicit and matching
  EXPECT_EQ(ResolveLayout(cfg, 2), (parallel::ParallelDims{2, 1, 1, 2}));
}

TEST(ResolveLayout, RanksThatDoNotMatchTheLayoutAreOneLine) {
  RunConfig cfg;
  cfg.source = "a.toml";
  cfg.parallel.tp = 4;  // gpt2-mini: 4 heads; 6 ranks leave no whole dp
  std::string msg = BadInputMessage([&] { ResolveLayout(cfg, 6); });
  EXPECT_EQ(msg,
            "config a.toml: [parallel] tp=4 x pp=1 x dp=1 = 4 does not match the 6 ranks launched");
  cfg = RunConfig{};
  cfg.parallel.dp = 3;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 1); });
  EXPECT_NE(msg.find("[parallel] tp=1 x pp=1 x dp=3 = 3 does not match the 1 ranks launched"),
            std::string::npos)
      << msg;
  cfg.parallel.dp = -1;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 1); });
  EXPECT_NE(msg.find("[parallel] dp=-1: expected an integer >= 1, or 0"), std::string::npos) << msg;
  cfg.parallel.dp = 0;
  cfg.parallel.pp = 0;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 1); });
  EXPECT_NE(msg.find("[parallel] pp=0: expected an integer >= 1"), std::string::npos) << msg;
}

TEST(ResolveLayout, ZeroStageOutOfRangeIsBadInput) {
  RunConfig cfg = LoadConfig("", {"parallel.zero=4"});
  std::string msg = BadInputMessage([&] { ResolveLayout(cfg, 1); });
  EXPECT_EQ(msg, "config (defaults): [parallel] zero=4: expected 0, 1, 2 or 3");
  cfg.parallel.zero = -1;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 1); });
  EXPECT_NE(msg.find("zero=-1: expected 0, 1, 2 or 3"), std::string::npos) << msg;
}

TEST(ResolveLayout, TpMustDivideTheHeads) {
  RunConfig cfg;
  cfg.source = "tiny.toml";
  cfg.model.name = "gpt2-tiny";  // 2 heads, 2 layers
  cfg.train.batch_size = 10;
  cfg.parallel.tp = 5;
  std::string msg = BadInputMessage([&] { ResolveLayout(cfg, 5); });
  EXPECT_NE(msg.find("config tiny.toml: [parallel] tp=5 does not divide model.n_head=2"),
            std::string::npos)
      << msg;
  cfg.parallel.tp = 1;
  cfg.parallel.pp = 3;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 3); });
  EXPECT_NE(msg.find("[parallel] pp=3 does not divide model.n_layer=2"), std::string::npos) << msg;
}

TEST(ResolveLayout, BatchMustSplitOverDp) {
  RunConfig cfg;
  cfg.source = "a.toml";
  cfg.train.batch_size = 10;
  std::string msg = BadInputMessage([&] { ResolveLayout(cfg, 4); });
  EXPECT_EQ(msg, "config a.toml: [train] batch_size: 10 is not divisible by ranks (4)");
  cfg.parallel.dp = 4;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 4); });
  EXPECT_EQ(msg, "config a.toml: [train] batch_size: 10 is not divisible by parallel.dp (4)");
  cfg.parallel.dp = 2;
  cfg.train.micro_batch_size = 4;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 2); });
  EXPECT_NE(msg.find("[train] batch_size: 10 is not divisible by parallel.dp (2) × "
                     "micro_batch_size (4)"),
            std::string::npos)
      << msg;
  cfg.train.micro_batch_size = 5;
  EXPECT_EQ(ResolveLayout(cfg, 2).dp, 2);
}

TEST(ResolveLayout, TensorParallelismLeavesTheRestToDp) {
  RunConfig cfg;  // gpt2-mini: 4 heads, 4 layers, batch 8
  cfg.parallel.tp = 2;
  EXPECT_EQ(ResolveLayout(cfg, 2), (parallel::ParallelDims{1, 2, 1, 0}));
  EXPECT_EQ(ResolveLayout(cfg, 8), (parallel::ParallelDims{4, 2, 1, 0}));
  cfg.parallel.pp = 2;
  cfg.train.micro_batch_size = 1;
  EXPECT_EQ(ResolveLayout(cfg, 8), (parallel::ParallelDims{2, 2, 2, 0}));
}

TEST(ResolveLayout, SequenceParallelismNeedsTpAndEvenRows) {
  RunConfig cfg;  // gpt2-mini: 4 heads, batch 8, seq_len 256
  cfg.parallel.sp = true;
  std::string msg = BadInputMessage([&] { ResolveLayout(cfg, 1); });
  EXPECT_EQ(msg,
            "config (defaults): [parallel] sp=true splits the sequence over the tensor-parallel "
            "group: it needs tp > 1 (got tp=1)");
  cfg.parallel.tp = 4;
  cfg.train.micro_batch_size = 1;
  cfg.data.seq_len = 6;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 4); });
  EXPECT_NE(msg.find("sp=true splits each micro-batch's 1 x 6 tokens over tp=4 ranks"),
            std::string::npos)
      << msg;
  cfg.data.seq_len = 8;
  EXPECT_EQ(ResolveLayout(cfg, 4).tp, 4);
}

// The vocabulary is padded to a multiple of 128 rows: a tp with another prime factor cannot
// split it even where it splits the heads.
TEST(ResolveLayout, TpMustDivideThePaddedVocabulary) {
  RunConfig cfg;
  cfg.model.name = "gpt2-tiny";
  cfg.model.n_head = 5;
  cfg.model.n_embd = 40;
  cfg.train.batch_size = 5;
  cfg.parallel.tp = 5;
  const std::string msg = BadInputMessage([&] { ResolveLayout(cfg, 5); });
  EXPECT_NE(msg.find("[parallel] tp=5 does not divide model.vocab_size padded to 50304"),
            std::string::npos)
      << msg;
}

TEST(ResolveLayout, PipelineNeedsMicroBatchesAndZeroAtMostOne) {
  RunConfig cfg;  // gpt2-mini: 4 layers, batch 8
  cfg.parallel.pp = 2;
  // 4 ranks: dp 2, so 4 sequences per rank in one micro-batch: too few for 1F1B over 2 stages.
  std::string msg = BadInputMessage([&] { ResolveLayout(cfg, 4); });
  EXPECT_EQ(msg,
            "config (defaults): [parallel] pp=2 needs at least 2 micro-batches per step for the "
            "1F1B schedule, got 1 (train.batch_size 8 / dp 2 / train.micro_batch_size 4); lower "
            "train.micro_batch_size");
  cfg.train.micro_batch_size = 2;
  const parallel::Layout d = ResolveLayout(cfg, 4);
  EXPECT_EQ(d.dp, 2);
  EXPECT_EQ(d.pp, 2);
  cfg.parallel.zero = 2;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 4); });
  EXPECT_NE(msg.find("[parallel] zero=2 with pp=2: pipeline stages take ZeRO 0 or 1"),
            std::string::npos)
      << msg;
  cfg.parallel.zero = 1;
  cfg.parallel.pp = 3;  // 4 layers
  msg = BadInputMessage([&] { ResolveLayout(cfg, 3); });
  EXPECT_NE(msg.find("pp=3 does not divide model.n_layer=4"), std::string::npos) << msg;
}

TEST(ResolveLayout, PipelineLayersPerStageAreCheckedAndMayBeUneven) {
  RunConfig cfg;  // gpt2-mini: 4 layers, batch 8
  cfg.parallel.pp = 2;
  cfg.train.micro_batch_size = 2;
  EXPECT_TRUE(ResolveLayout(cfg, 2).stage_layers.empty());  // equal stages
  cfg.parallel.pp_layers = "3,1";
  EXPECT_EQ(ResolveLayout(cfg, 2).stage_layers, (std::vector<int>{3, 1}));
  EXPECT_EQ(ResolveLayout(cfg, 2).pp, 2);
  cfg.parallel.pp_layers = "auto";
  EXPECT_EQ(ResolveLayout(cfg, 2).stage_layers,
            model::BalancedStageLayers(cfg.ResolvedModel(), cfg.data.seq_len, 2));
  cfg.parallel.pp = 3;  // 4 layers do not split equally over 3 stages, but 2+1+1 is fine
  cfg.parallel.pp_layers = "2,1,1";
  cfg.train.batch_size = 6;
  EXPECT_EQ(ResolveLayout(cfg, 3).pp, 3);
  cfg.parallel.pp_layers = "2,1";
  EXPECT_EQ(BadInputMessage([&] { ResolveLayout(cfg, 3); }),
            "config (defaults): [parallel] pp_layers: \"2,1\" gives 2 stage(s) of 3 layers in all; "
            "the run has pp=3 and model.n_layer=4");
  cfg.parallel.pp_layers = "2,,2";
  EXPECT_NE(BadInputMessage([&] { ResolveLayout(cfg, 3); }).find("expected \"auto\" or blocks per"),
            std::string::npos);
  cfg.parallel.pp_layers = "2,0,2";
  EXPECT_NE(BadInputMessage([&] { ResolveLayout(cfg, 3); }).find("(each >= 1)"), std::string::npos);
  cfg.parallel.pp = 2;
  cfg.train.batch_size = 8;
  cfg.parallel.pp_layers = "3,1";
  cfg.parallel.virtual_stages = 2;
  EXPECT_NE(BadInputMessage([&] { ResolveLayout(cfg, 2); }).find("uneven stages do not interleave"),
            std::string::npos);
}

}  // namespace
}  // namespace keel::train

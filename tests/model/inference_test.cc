// KV-cache generation against the training model: feeding a sequence one token at a time must give
// the logits that the full forward pass gives at every position.
#include "keel/model/inference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "keel/core/error.h"
#include "keel/model/transformer.h"

namespace keel::model {
namespace {

// `sharpen` scales the weights by 8, so that attention is peaked: a key rotated at the wrong
// position or read from the wrong group's head moves the logits well past the tolerance.
void CheckStepsMatchForward(const ModelConfig& cfg, int T, float sharpen) {
  Transformer m(cfg, DType::kF32, 1, T, Recompute::kNone);
  InitParams(m.layout(), cfg, 5, m.master());
  for (const ParamInfo& p : m.layout().params())
    if (p.init_std > 0)
      for (size_t i = 0; i < p.numel; ++i) m.master()[p.offset + i] *= sharpen;
  std::vector<int32_t> tokens(T);
  for (int t = 0; t < T; ++t) tokens[t] = (t * 7919 + 13) % cfg.vocab_size;
  std::vector<float> full(size_t(T) * cfg.vocab_size);
  m.ForwardLogits(tokens.data(), full.data());

  Generator gen(cfg, std::vector<float>(m.master(), m.master() + m.layout().total()));
  for (int t = 0; t < T; ++t) {
    const std::vector<float>& step = gen.Step(tokens[t]);
    double max_diff = 0, max_ref = 0;
    for (int v = 0; v < cfg.vocab_size; ++v) {
      max_diff =
          std::max(max_diff, double(std::abs(step[v] - full[size_t(t) * cfg.vocab_size + v])));
      max_ref = std::max(max_ref, double(std::abs(full[size_t(t) * cfg.vocab_size + v])));
    }
    EXPECT_LT(max_diff, 1e-5 * std::max(1.0, max_ref)) << "position " << t;
  }
}

TEST(Generator, StepLogitsMatchTheTrainingForward) {
  CheckStepsMatchForward(ModelConfig{2, 2, 32, 50257, 16}, 12, 1.0f);
}

// Grouped-query attention (4 query heads on 2 key/value heads) and rotary positions.
TEST(Generator, LlamaStepLogitsMatchTheTrainingForward) {
  CheckStepsMatchForward(NamedConfig("llama-tiny"), 20, 8.0f);
}

TEST(Generator, GreedyIsDeterministicAndStopsAtTheContext) {
  const ModelConfig cfg{1, 2, 16, 50257, 8};
  auto layout = ParamLayout::Whole(cfg);
  std::vector<float> w(layout.total());
  InitParams(layout, cfg, 3, w.data());
  Generator gen(cfg, w);
  SampleOptions opt;
  opt.temperature = 0;
  opt.max_tokens = 100;
  auto a = gen.Generate({1, 2, 3}, opt);
  auto b = gen.Generate({1, 2, 3}, opt);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 5u);  // 3 prompt tokens + 5 = the context of 8
  opt.temperature = 1.0f;
  opt.top_k = 5;
  opt.seed = 9;
  EXPECT_EQ(gen.Generate({1}, opt), gen.Generate({1}, opt));
  EXPECT_THROW(gen.Generate({}, opt), std::exception);
}

// A NaN weight (a diverged run's last checkpoint) is an error, not one token printed again and
// again: greedy decoding took token 0 (max_element never picks past a NaN at 0).
TEST(Generator, ANanWeightIsAnErrorNotARepeatedToken) {
  const ModelConfig cfg{1, 2, 16, 50257, 8};
  auto layout = ParamLayout::Whole(cfg);
  std::vector<float> w(layout.total());
  InitParams(layout, cfg, 3, w.data());
  w[layout.Find("wte.weight").offset] = NAN;  // token 0's embedding row: logit 0 is NaN
  Generator gen(cfg, w);
  SampleOptions opt;
  opt.temperature = 0;
  opt.max_tokens = 3;
  EXPECT_THROW(gen.Generate({1, 2}, opt), Error);
  opt.temperature = 1.0f;
  EXPECT_THROW(gen.Generate({1, 2}, opt), Error);
}

// A draw at the very top (Philox's Uniform may return 1.0) leaves u a rounding error above 0
// after every candidate: it goes to the last candidate that has a probability, not to one of 0.
TEST(Sampler, ADrawPastTheSumTakesTheLastCandidateWithAProbability) {
  const double probs[] = {1.0, 0.2, 0.1, 0.0};
  const double sum = 1.0 + 0.2 + 0.1;
  EXPECT_EQ(SampleIndex(probs, 4, 0.0), 0);
  EXPECT_EQ(SampleIndex(probs, 4, 1.1), 1);
  EXPECT_EQ(SampleIndex(probs, 4, sum), 2);
  EXPECT_EQ(SampleIndex(probs, 4, sum + 1e-12), 2);
}

}  // namespace
}  // namespace keel::model

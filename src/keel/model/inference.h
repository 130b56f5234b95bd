// Text generation from trained fp32 weights, one token at a time with a key/value cache: each new
// token costs one row through every block instead of re-running the whole context.
//
//   Generator gen(cfg, weights);             // weights: ParamLayout::Whole(cfg).total() floats
//   auto out = gen.Generate(prompt_ids, {.max_tokens = 64, .temperature = 0.8f, .top_k = 40});
#pragma once

#include <cstdint>
#include <vector>

#include "keel/model/config.h"
#include "keel/model/params.h"

namespace keel::model {

struct SampleOptions {
  int max_tokens = 64;
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = the whole vocabulary
  uint64_t seed = 1;
  int stop_token = -1;  // e.g. <|endoftext|>; -1 = never stop early
};

class Generator {
 public:
  Generator(const ModelConfig& cfg, std::vector<float> weights);

  // The new tokens only (not the prompt). Stops at the context length, max_tokens or stop_token.
  std::vector<int32_t> Generate(const std::vector<int32_t>& prompt, const SampleOptions& opt);

  // Logits (V floats) after feeding `token` at the next position; exposed for tests.
  const std::vector<float>& Step(int32_t token);
  void Reset() { pos_ = 0; }

 private:
  ModelConfig cfg_;
  ParamLayout layout_;
  std::vector<float> w_;
  std::vector<float> k_cache_, v_cache_;  // (L, block_size, C)
  std::vector<float> x_, ln_, qkv_, y_, fc_, fc_gelu_, logits_, scores_;
  std::vector<float> mean_, rstd_;
  int pos_ = 0;
};

}  // namespace keel::model

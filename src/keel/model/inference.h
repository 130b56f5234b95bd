// Text generation from trained fp32 weights, one token at a time with a key/value cache: each new
// token costs one row through every block instead of re-running the whole context. Both families;
// a Llama's cache holds its key/value heads only (grouped-query attention), each key rotated at
// its own position once.
//
//   Generator gen(cfg, weights);             // weights: ParamLayout::Whole(cfg).total() floats
//   auto out = gen.Generate(prompt_ids, {.max_tokens = 64, .temperature = 0.8f, .top_k = 40});
#pragma once

#include <cstdint>
#include <string>
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

// The sampler's pick among `n` candidates of unnormalized probabilities `probs` (descending) for a
// draw u in [0, their sum]: the first whose running sum reaches u; a u past them all (rounding)
// takes the last with a probability above 0.
int SampleIndex(const double* probs, int n, double u);

class Generator {
 public:
  Generator(const ModelConfig& cfg, std::vector<float> weights);

  // The new tokens only (not the prompt). Stops at the context length, max_tokens or stop_token.
  std::vector<int32_t> Generate(const std::vector<int32_t>& prompt, const SampleOptions& opt);

  // Logits (V floats) after feeding `token` at the next position; exposed for tests.
  const std::vector<float>& Step(int32_t token);
  void Reset() { pos_ = 0; }

 private:
  const float* P(const std::string& name) const { return w_.data() + layout_.Find(name).offset; }
  void Gpt2Block(int l, int t);
  void LlamaBlock(int l, int t);
  // Appends position t's key and value (in qkv_) to layer l's cache; attention of qkv_'s queries
  // over positions [0, t] into y_.
  void Attend(int l, int t);

  ModelConfig cfg_;
  ParamLayout layout_;
  std::vector<float> w_;
  std::vector<float> k_cache_, v_cache_;  // (L, block_size, kv_heads · hs)
  std::vector<float> x_, ln_, qkv_, y_, fc_, fc_gelu_, logits_, scores_;
  std::vector<float> mean_, rstd_;
  int pos_ = 0;
};

}  // namespace keel::model

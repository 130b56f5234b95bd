// GPT-2 model shapes and the named configurations.
//
//   keel::model::ModelConfig c = keel::model::NamedConfig("gpt2");  // 124M
#pragma once

#include <string>
#include <vector>

namespace keel::model {

struct ModelConfig {
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int vocab_size = 50257;  // the real vocabulary; padded internally (padded_vocab())
  int block_size = 1024;   // maximum context (rows of the position embedding)

  int head_size() const { return n_embd / n_head; }
  // Rows of the token embedding: the vocabulary rounded up to a multiple of 128, so that the
  // classifier's matrix products stay on fast tile sizes. The padded logits are masked.
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
};

// Throws keel::Error (bad input) naming the key when shapes are inconsistent.
void Validate(const ModelConfig& c);

// "gpt2-tiny" (tests), "gpt2-mini" (quickstart), "gpt2" (124M), "gpt2-medium" (350M),
// "gpt2-large" (774M), "gpt2-xl" (1.5B). Throws on an unknown name, listing the known ones.
ModelConfig NamedConfig(const std::string& name);
std::vector<std::string> NamedConfigNames();

}  // namespace keel::model

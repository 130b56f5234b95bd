#include "keel/model/config.h"

#include <map>

#include "keel/core/error.h"

namespace keel::model {
namespace {

const std::map<std::string, ModelConfig>& Table() {
  static const std::map<std::string, ModelConfig> table = {
      {"gpt2-tiny", {2, 2, 32, 50257, 64}},         {"gpt2-mini", {4, 4, 256, 50257, 256}},
      {"gpt2-small6", {6, 6, 384, 50257, 1024}},    {"gpt2", {12, 12, 768, 50257, 1024}},
      {"gpt2-medium", {24, 16, 1024, 50257, 1024}}, {"gpt2-large", {36, 20, 1280, 50257, 1024}},
      {"gpt2-xl", {48, 25, 1600, 50257, 1024}},
  };
  return table;
}

}  // namespace

void Validate(const ModelConfig& c) {
  auto positive = [](const char* key, int v) {
    if (v <= 0)
      ThrowBadInput(std::string("[model] ") + key + ": expected a positive integer, got " +
                    std::to_string(v));
  };
  positive("n_layer", c.n_layer);
  positive("n_head", c.n_head);
  positive("n_embd", c.n_embd);
  positive("vocab_size", c.vocab_size);
  positive("block_size", c.block_size);
  if (c.n_embd % c.n_head != 0)
    ThrowBadInput("[model] n_embd: expected a multiple of n_head = " + std::to_string(c.n_head) +
                  ", got " + std::to_string(c.n_embd));
}

ModelConfig NamedConfig(const std::string& name) {
  auto it = Table().find(name);
  if (it == Table().end()) {
    std::string known;
    for (auto& [k, v] : Table()) known += (known.empty() ? "" : ", ") + k;
    ThrowBadInput("[model] name: unknown model \"" + name + "\"; known: " + known);
  }
  return it->second;
}

std::vector<std::string> NamedConfigNames() {
  std::vector<std::string> names;
  for (auto& [k, v] : Table()) names.push_back(k);
  return names;
}

}  // namespace keel::model

// The parameter registry: every tensor of a GPT-2 model as a named view into one flat buffer.
//
// Order matters. Tensors are laid out wte, wpe, h.0.*, ..., h.{L-1}.*, ln_f, which is the reverse
// of the order in which backward finishes their gradients (except the tied wte, finished last by
// the embedding backward): the gradients that are final at any moment of backward form one suffix
// [offset, end) of the flat buffer, so all-reduce buckets are plain slices.
//
// Shapes are keel's [out, in]; export transposes to Hugging Face's Conv1D [in, out].
//
//   auto layout = keel::model::ParamLayout::Gpt2(cfg);
//   const auto& p = layout.Find("h.0.attn.c_attn.weight");   // p.offset, p.numel, p.shape
#pragma once

#include <cstddef>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/model/config.h"

namespace keel::model {

struct ParamInfo {
  std::string name;
  std::vector<int> shape;
  size_t offset = 0;  // in elements, into the flat buffer
  size_t numel = 0;
  bool decay = false;  // weight decay applies (matrices and embeddings)
  float init_std = 0;  // 0: constant init (init_value)
  float init_value = 0;
};

class ParamLayout {
 public:
  static ParamLayout Gpt2(const ModelConfig& cfg, float init_std = 0.02f);

  const std::vector<ParamInfo>& params() const { return params_; }
  size_t total() const { return total_; }
  // Throws keel::Error if the name is unknown.
  const ParamInfo& Find(const std::string& name) const;
  // First element of layer l's tensors (h.l.*); layer_start(L) is where ln_f begins.
  size_t layer_start(int l) const { return layer_start_[l]; }

 private:
  void Add(std::string name, std::vector<int> shape, bool decay, float std, float value = 0);
  std::vector<ParamInfo> params_;
  // Find runs per layer per step (and per token in generation): a hash, not a scan of 150 names.
  std::unordered_map<std::string, size_t> index_;
  std::vector<size_t> layer_start_;
  size_t total_ = 0;
};

// Fills `out` (layout.total() floats) with the initial weights: a pure function of the seed, the
// tensor's index and the element's index (Philox), so every rank and thread count agrees.
// The padded vocabulary rows of wte start at zero.
void InitParams(const ParamLayout& layout, const ModelConfig& cfg, uint64_t seed, float* out);

}  // namespace keel::model

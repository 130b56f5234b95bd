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
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/model/config.h"
#include "keel/parallel/state_bytes.h"

namespace keel::model {

struct ParamInfo {
  std::string name;
  std::vector<int> shape;
  size_t offset = 0;  // in elements, into the flat buffer
  size_t numel = 0;
  bool decay = false;  // weight decay applies (matrices and embeddings)
  float init_std = 0;  // 0: constant init (init_value)
  float init_value = 0;
  // A matrix product's bias: bf16 runs add it in fp32, so it is also kept as fp32 at this index
  // of the compact bias buffer (ParamLayout::n_bias() floats). SIZE_MAX for every other tensor.
  size_t bias_index = SIZE_MAX;
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

  // Segments: the units in which weights are gathered and gradients reduced under ZeRO, in
  // layout order: 0 the embeddings (wte, wpe), 1 + l block l, n_layer + 1 the final LayerNorm.
  int segments() const { return int(layer_start_.size()) + 1; }
  size_t segment_start(int s) const { return s == 0 ? 0 : layer_start_[s - 1]; }
  size_t segment_end(int s) const { return s + 1 == segments() ? total_ : layer_start_[s]; }
  size_t segment_size(int s) const { return segment_end(s) - segment_start(s); }
  size_t n_bias() const { return n_bias_; }

 private:
  void Add(std::string name, std::vector<int> shape, bool decay, float std, float value = 0);
  std::vector<ParamInfo> params_;
  // Find runs per layer per step (and per token in generation): a hash, not a scan of 150 names.
  std::unordered_map<std::string, size_t> index_;
  std::vector<size_t> layer_start_;
  size_t total_ = 0;
  size_t n_bias_ = 0;
};

// The sizes parallel::StateBytesPerRank needs, from the layout (trainer and planner alike).
parallel::StateShape StateShapeOf(const ParamLayout& layout, DType dtype);

// Fills `out` (layout.total() floats) with the initial weights: a pure function of the seed, the
// tensor's index and the element's index (Philox), so every rank and thread count agrees.
// The padded vocabulary rows of wte start at zero.
void InitParams(const ParamLayout& layout, const ModelConfig& cfg, uint64_t seed, float* out);

}  // namespace keel::model

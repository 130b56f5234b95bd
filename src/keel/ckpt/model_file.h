// A trained model as one safetensors file: every tensor of the parameter registry in fp32 under
// keel's names and shapes, and the model's shape in the metadata (keel.n_layer, ...), so that
// `keel generate` needs nothing else.
//
//   WriteModel("runs/x/model.safetensors", cfg, layout, master);
//   LoadedModel m = ReadModel("runs/x/model.safetensors");   // m.config, m.weights
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "keel/model/config.h"
#include "keel/model/params.h"

namespace keel::ckpt {

void WriteModel(const std::string& path, const model::ModelConfig& cfg,
                const model::ParamLayout& layout, const float* weights);

struct LoadedModel {
  model::ModelConfig config;
  std::vector<float> weights;  // in ParamLayout::Whole(config) order
};

// Throws keel::Error (bad input) naming the file and the missing key or mismatched tensor.
LoadedModel ReadModel(const std::string& path);

// A model's weights read a tensor at a time, its headers checked when opened (every tensor there,
// with its shape): what a LoRA run's frozen base streams from, so that no rank holds the whole
// model in fp32 (an 8B's 32 GB). The readers of whole models (ReadModel, ReadHfLlama) are a Read
// of every tensor.
class TensorSource {
 public:
  using Reader = std::function<void(const model::ParamInfo& p, float* out)>;
  TensorSource(const model::ModelConfig& config, Reader read)
      : config_(config), layout_(model::ParamLayout::Whole(config)), read_(std::move(read)) {}

  const model::ModelConfig& config() const { return config_; }
  const model::ParamLayout& layout() const { return layout_; }  // ParamLayout::Whole(config())
  // Tensor `name` of layout(), whole, in fp32 (padded vocabulary rows zero). Throws keel::Error
  // (bad input) naming the file and the tensor where its data is not finite or cut short.
  void Read(const std::string& name, float* out) const { read_(layout_.Find(name), out); }

 private:
  model::ModelConfig config_;
  model::ParamLayout layout_;
  Reader read_;
};

// A keel model file's tensors (its metadata's config), checked as ReadModel checks them.
TensorSource OpenModel(const std::string& path);

}  // namespace keel::ckpt

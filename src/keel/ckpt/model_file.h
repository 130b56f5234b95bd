// A trained model as one safetensors file: every tensor of the parameter registry in fp32 under
// keel's names and shapes, and the model's shape in the metadata (keel.n_layer, ...), so that
// `keel generate` needs nothing else.
//
//   WriteModel("runs/x/model.safetensors", cfg, layout, master);
//   LoadedModel m = ReadModel("runs/x/model.safetensors");   // m.config, m.weights
#pragma once

#include <string>
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

}  // namespace keel::ckpt

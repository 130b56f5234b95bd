#include "keel/ckpt/model_file.h"

#include <algorithm>

#include "keel/ckpt/safetensors.h"
#include "keel/core/error.h"

namespace keel::ckpt {

void WriteModel(const std::string& path, const model::ModelConfig& cfg,
                const model::ParamLayout& layout, const float* weights) {
  SafetensorsWriter w;
  for (const auto& p : layout.params())
    w.Add(p.name, std::vector<int64_t>(p.shape.begin(), p.shape.end()), weights + p.offset);
  w.SetMetadata("format", "keel-model");
  for (const auto& [key, value] : model::ShapeKeys(cfg)) w.SetMetadata("keel." + key, value);
  w.Write(path);
}

LoadedModel ReadModel(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::Read(path);
  LoadedModel m;
  // Model files from before Llama carry the five GPT-2 keys only: their family is gpt2.
  for (const char* key :
       {"keel.n_layer", "keel.n_head", "keel.n_embd", "keel.vocab_size", "keel.block_size"})
    if (!f.metadata().count(key))
      ThrowBadInput(path + ": metadata has no \"" + key + "\" (expected a model written by keel)");
  for (const auto& [key, value] : f.metadata())
    if (key.rfind("keel.", 0) == 0)
      model::SetShapeKey(m.config, key.substr(5), value, path + ": metadata");
  try {
    model::Validate(m.config);
  } catch (const Error& e) {
    ThrowBadInput(path + ": metadata keel.*: " + e.what());
  }
  const auto layout = model::ParamLayout::Whole(m.config);
  m.weights.resize(layout.total());
  for (const auto& p : layout.params()) {
    const Fp32Tensor& t = f.Get(p.name);
    if (!std::equal(t.shape.begin(), t.shape.end(), p.shape.begin(), p.shape.end()))
      ThrowBadInput(path + ": tensor \"" + p.name + "\" has the wrong shape for its config");
    std::copy(t.data.begin(), t.data.end(), m.weights.begin() + p.offset);
  }
  return m;
}

}  // namespace keel::ckpt

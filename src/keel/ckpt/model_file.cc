#include "keel/ckpt/model_file.h"

#include <algorithm>
#include <memory>

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

TensorSource OpenModel(const std::string& path) {
  auto f = std::make_shared<const SafetensorsIndex>(SafetensorsIndex::Open(path));
  model::ModelConfig config;
  // Model files from before Llama carry the five GPT-2 keys only: their family is gpt2.
  for (const char* key :
       {"keel.n_layer", "keel.n_head", "keel.n_embd", "keel.vocab_size", "keel.block_size"})
    if (!f->metadata().count(key))
      ThrowBadInput(path + ": metadata has no \"" + key + "\" (expected a model written by keel)");
  for (const auto& [key, value] : f->metadata())
    if (key.rfind("keel.", 0) == 0)
      model::SetShapeKey(config, key.substr(5), value, path + ": metadata");
  try {
    model::Validate(config);
  } catch (const Error& e) {
    ThrowBadInput(path + ": metadata keel.*: " + e.what());
  }
  TensorSource src(config,
                   [f](const model::ParamInfo& p, float* out) { f->ReadInto(p.name, out); });
  for (const auto& p : src.layout().params()) {
    const std::vector<int64_t>& shape = f->Get(p.name).shape;
    if (!std::equal(shape.begin(), shape.end(), p.shape.begin(), p.shape.end()))
      ThrowBadInput(path + ": tensor \"" + p.name + "\" has the wrong shape for its config");
  }
  // A tensor its config has no place for (a layer past n_layer, an untied lm_head) would be
  // dropped without a word; the file is not what its metadata says.
  if (f->entries().size() != src.layout().params().size())
    for (const auto& [name, entry] : f->entries()) {
      bool known = false;
      for (const auto& p : src.layout().params()) known = known || p.name == name;
      if (!known)
        ThrowBadInput(path + ": tensor \"" + name + "\" is not one of its config's (keel." +
                      "n_layer and the family's tensors); the file is not what its metadata says");
    }
  return src;
}

LoadedModel ReadModel(const std::string& path) {
  const TensorSource src = OpenModel(path);
  LoadedModel m;
  m.config = src.config();
  m.weights.resize(src.layout().total());
  for (const auto& p : src.layout().params()) src.Read(p.name, m.weights.data() + p.offset);
  return m;
}

}  // namespace keel::ckpt

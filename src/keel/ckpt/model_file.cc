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
  w.SetMetadata("keel.n_layer", std::to_string(cfg.n_layer));
  w.SetMetadata("keel.n_head", std::to_string(cfg.n_head));
  w.SetMetadata("keel.n_embd", std::to_string(cfg.n_embd));
  w.SetMetadata("keel.vocab_size", std::to_string(cfg.vocab_size));
  w.SetMetadata("keel.block_size", std::to_string(cfg.block_size));
  w.Write(path);
}

LoadedModel ReadModel(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::Read(path);
  auto meta = [&](const char* key) {
    auto it = f.metadata().find(key);
    if (it == f.metadata().end())
      ThrowBadInput(path + ": metadata has no \"" + key + "\" (expected a model written by keel)");
    try {
      return std::stoi(it->second);
    } catch (const std::exception&) {
      ThrowBadInput(path + ": metadata \"" + key + "\": expected an integer, got \"" + it->second +
                    "\"");
    }
  };
  LoadedModel m;
  m.config.n_layer = meta("keel.n_layer");
  m.config.n_head = meta("keel.n_head");
  m.config.n_embd = meta("keel.n_embd");
  m.config.vocab_size = meta("keel.vocab_size");
  m.config.block_size = meta("keel.block_size");
  try {
    model::Validate(m.config);
  } catch (const Error& e) {
    ThrowBadInput(path + ": metadata keel.*: " + e.what());
  }
  const auto layout = model::ParamLayout::Gpt2(m.config);
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

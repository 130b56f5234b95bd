#include "keel/ckpt/checkpoint_model.h"

#include "keel/ckpt/reader.h"
#include "keel/core/error.h"

namespace keel::ckpt {

nlohmann::json ModelConfigToJson(const model::ModelConfig& c) {
  return {{"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_embd", c.n_embd},
          {"vocab_size", c.vocab_size},
          {"block_size", c.block_size}};
}

model::ModelConfig ModelConfigFromJson(const nlohmann::json& j, const std::string& where) {
  model::ModelConfig c;
  for (auto [key, field] : {std::pair{"n_layer", &c.n_layer},
                            {"n_head", &c.n_head},
                            {"n_embd", &c.n_embd},
                            {"vocab_size", &c.vocab_size},
                            {"block_size", &c.block_size}}) {
    if (!j.is_object() || !j.contains(key) || !j.at(key).is_number_integer())
      ThrowBadInput(where + ": state.model." + key + ": expected an integer");
    *field = j.at(key).get<int>();
  }
  try {
    model::Validate(c);
  } catch (const Error& e) {
    ThrowBadInput(where + ": state.model: " + e.what());
  }
  return c;
}

std::vector<TensorSpec> TensorSpecs(const model::ParamLayout& layout) {
  std::vector<TensorSpec> specs;
  for (const auto& p : layout.params()) {
    TensorSpec t;
    t.name = p.name;
    t.shape.assign(p.global_shape.begin(), p.global_shape.end());
    t.offset = p.offset;
    t.replica = p.replica;
    if (p.shape != p.global_shape) {
      t.local_shape.assign(p.shape.begin(), p.shape.end());
      t.tp_axis = p.tp_axis;
      t.tp_groups = p.tp_groups;
      t.tp_rank = layout.tp().rank;
    }
    specs.push_back(std::move(t));
  }
  return specs;
}

LoadedModel ReadCheckpointModel(const std::string& dir) {
  CheckpointReader r = CheckpointReader::Open(dir);
  const nlohmann::json& state = r.manifest().state;
  LoadedModel m;
  m.config = ModelConfigFromJson(state.contains("model") ? state.at("model") : nlohmann::json(),
                                 dir + "/manifest.json");
  const auto layout = model::ParamLayout::Gpt2(m.config);
  m.weights.assign(layout.total(), 0.0f);
  r.Load(TensorSpecs(layout), {{"master", m.weights.data()}});
  return m;
}

}  // namespace keel::ckpt

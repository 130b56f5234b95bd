#include "keel/ckpt/checkpoint_model.h"

#include <set>
#include <tuple>

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

void CheckManifestModel(const Manifest& m, const std::string& dir) {
  if (!m.state.contains("model")) return;
  const std::string where = dir + "/manifest.json";
  const model::ModelConfig cfg = ModelConfigFromJson(m.state.at("model"), where);
  const model::ParamLayout layout = model::ParamLayout::Gpt2(cfg);
  std::set<std::string> kinds;
  for (const TensorEntry& t : m.tensors) kinds.insert(t.kind);
  auto shape = [](const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  };
  for (const std::string& kind : kinds)
    for (const model::ParamInfo& p : layout.params()) {
      const TensorEntry* t = m.Find(p.name, kind);
      const std::vector<int64_t> want(p.shape.begin(), p.shape.end());
      if (!t)
        ThrowBadInput(where + ": no tensor " + p.name + " (" + kind + "), which the model it " +
                      "describes (state.model: " + std::to_string(cfg.n_layer) + " layers) has");
      if (t->shape != want)
        ThrowBadInput(where + ": " + p.name + " (" + kind + ") has shape " + shape(t->shape) +
                      ", the model it describes (state.model) has " + shape(want));
    }
  for (const TensorEntry& t : m.tensors) {
    bool known = true;
    try {
      (void)layout.Find(t.name);
    } catch (const Error&) {
      known = false;
    }
    if (!known)
      ThrowBadInput(
          where + ": tensor " + t.name + " (" + t.kind +
          ") is not part of the model it describes (state.model: " + std::to_string(cfg.n_layer) +
          " layers, " + std::to_string(cfg.n_head) + " heads)");
  }
}

void CheckSameModel(const Manifest& m, const model::ModelConfig& run, const std::string& dir) {
  if (!m.state.contains("model")) return;
  const model::ModelConfig saved = ModelConfigFromJson(m.state.at("model"), dir + "/manifest.json");
  for (auto [key, a, b] : {std::tuple{"n_layer", saved.n_layer, run.n_layer},
                           {"n_head", saved.n_head, run.n_head},
                           {"n_embd", saved.n_embd, run.n_embd},
                           {"vocab_size", saved.vocab_size, run.vocab_size},
                           {"block_size", saved.block_size, run.block_size}})
    if (a != b)
      ThrowBadInput(dir + ": the checkpoint is of another model: model." + key + " = " +
                    std::to_string(a) + " there, " + std::to_string(b) +
                    " in this run's config (resume with the model it was trained with)");
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
  r.Load(TensorSpecs(layout), {{"master", m.weights.data()}}, 0, 0, /*progress=*/true);
  return m;
}

}  // namespace keel::ckpt

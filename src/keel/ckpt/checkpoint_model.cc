#include "keel/ckpt/checkpoint_model.h"

#include <set>

#include "keel/ckpt/model_source.h"
#include "keel/ckpt/reader.h"
#include "keel/core/error.h"
#include "keel/model/working_copy.h"

namespace keel::ckpt {

nlohmann::json ModelConfigToJson(const model::ModelConfig& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [key, value] : model::ShapeKeys(c)) {
    if (key == "family" || key == "lora_targets" || key == "lora_base" || key == "lora_dora")
      j[key] = value;
    else if (key == "rope_theta" || key == "norm_eps" || key == "lora_alpha")
      j[key] = std::stod(value);
    else
      j[key] = std::stoi(value);
  }
  return j;
}

model::ModelConfig ModelConfigFromJson(const nlohmann::json& j, const std::string& where) {
  model::ModelConfig c;
  // Checkpoints from before Llama carry the five GPT-2 keys only: their family is gpt2.
  for (const char* key : {"n_layer", "n_head", "n_embd", "vocab_size", "block_size"})
    if (!j.is_object() || !j.contains(key) || !j.at(key).is_number_integer())
      ThrowBadInput(where + ": state.model." + key + ": expected an integer");
  for (const auto& [key, value] : j.items()) {
    std::string text;
    if (value.is_string())
      text = value.get<std::string>();
    else if (value.is_number_integer())
      text = std::to_string(value.get<long long>());
    else if (value.is_number())
      text = nlohmann::json(value.get<double>()).dump();
    else
      ThrowBadInput(where + ": state.model." + key + ": expected a number or a string");
    model::SetShapeKey(c, key, text, where + ": state.model");
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
  const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
  std::set<std::string> kinds;
  for (const TensorEntry& t : m.tensors)
    if (t.kind != kOwnKind) kinds.insert(t.kind);
  auto shape = [](const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  };
  // A LoRA run's checkpoint holds its adapters; the frozen base is state.base's.
  const bool adapters_only = HoldsAdaptersOnly(m);
  for (const std::string& kind : kinds)
    for (const model::ParamInfo& p : layout.params()) {
      if (adapters_only && !model::IsLoraParam(p.name)) continue;
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
    if (t.kind == kOwnKind) continue;  // a rank's own state, not the model's
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

bool HoldsAdaptersOnly(const Manifest& m) {
  return m.state.contains("base") && m.state.at("base").is_object();
}

void RebuildLoraBase(const nlohmann::json& base, const model::ModelConfig& cfg, float* whole,
                     const std::string& where) {
  const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
  auto text = [&](const char* key) {
    if (!base.contains(key) || !base.at(key).is_string())
      ThrowBadInput(where + ": state.base." + key + ": expected a string");
    return base.at(key).get<std::string>();
  };
  if (!base.contains("seed") || !base.at("seed").is_number_unsigned())
    ThrowBadInput(where + ": state.base.seed: expected an unsigned integer");
  model::InitParams(layout, cfg, base.at("seed").get<uint64_t>(), whole);
  const std::string from = text("init_from");
  if (!from.empty()) {
    try {
      LoadInitWeights(from, cfg, whole, text("init_adapter"));
    } catch (const Error& e) {
      ThrowBadInput(where + ": the LoRA run's frozen base (state.base.init_from): " + e.what());
    }
  }
  // The values the run computed with: a bf16 run held its frozen weights in bf16 (its
  // matrix-product biases in fp32), a quantized base as codes.
  model::RoundTripWorking(layout,
                          text("precision") == "bf16"   ? DType::kBF16
                          : text("precision") == "fp16" ? DType::kF16
                                                        : DType::kF32,
                          whole);
}

void CheckSameModel(const Manifest& m, const model::ModelConfig& run, const std::string& dir) {
  if (!m.state.contains("model")) return;
  const model::ModelConfig saved = ModelConfigFromJson(m.state.at("model"), dir + "/manifest.json");
  if (auto d = model::FirstDifference(saved, run))
    ThrowBadInput(dir + ": the checkpoint is of another model: model." + d->key + " = " + d->a +
                  " there, " + d->b +
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
      t.tp_blocks.assign(p.tp_blocks.begin(), p.tp_blocks.end());
      t.tp_rank = layout.tp().rank;
    }
    specs.push_back(std::move(t));
  }
  return specs;
}

namespace {

// The model a checkpoint holds (state.model).
model::ModelConfig ConfigOf(const CheckpointReader& r, const std::string& dir) {
  const nlohmann::json& state = r.manifest().state;
  return ModelConfigFromJson(state.contains("model") ? state.at("model") : nlohmann::json(),
                             dir + "/manifest.json");
}

}  // namespace

LoadedModel ReadCheckpointModel(const std::string& dir) {
  CheckpointReader r = CheckpointReader::Open(dir);
  LoadedModel m;
  m.config = ConfigOf(r, dir);
  const auto layout = model::ParamLayout::Whole(m.config);
  m.weights.assign(layout.total(), 0.0f);
  std::vector<TensorSpec> specs = TensorSpecs(layout);
  if (HoldsAdaptersOnly(r.manifest())) {
    RebuildLoraBase(r.manifest().state.at("base"), m.config, m.weights.data(),
                    dir + "/manifest.json");
    std::erase_if(specs, [](const TensorSpec& t) { return !model::IsLoraParam(t.name); });
  }
  r.Load(specs, {{"master", m.weights.data()}}, 0, 0, /*progress=*/true);
  // A LoRA run's checkpoint: its adapters merged, as the model file holds them.
  if (m.config.lora_rank > 0) {
    model::MergeLoraInPlace(m.config, m.weights);
    m.config = model::BaseModel(m.config);
  }
  return m;
}

LoadedModel ReadCheckpointAdapters(const std::string& dir) {
  CheckpointReader r = CheckpointReader::Open(dir);
  LoadedModel m;
  m.config = ConfigOf(r, dir);
  if (m.config.lora_rank == 0)
    ThrowBadInput(dir + ": the checkpoint has no LoRA adapters (state.model has no lora_rank)");
  const auto layout = model::ParamLayout::Whole(m.config);
  m.weights.assign(layout.grad_trained(), 0.0f);
  std::vector<TensorSpec> specs = TensorSpecs(layout);
  std::erase_if(specs, [](const TensorSpec& t) { return !model::IsLoraParam(t.name); });
  for (TensorSpec& t : specs) t.offset = layout.Find(t.name).grad_offset;
  r.Load(specs, {{"master", m.weights.data()}}, 0, 0, /*progress=*/true);
  return m;
}

}  // namespace keel::ckpt

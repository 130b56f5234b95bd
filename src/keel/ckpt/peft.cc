#include "keel/ckpt/peft.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/ckpt/hf_gpt2.h"
#include "keel/ckpt/hf_llama.h"
#include "keel/ckpt/safetensors.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/number_text.h"
#include "keel/model/params.h"

namespace keel::ckpt {
namespace {

// A float setting as JSON's number of its shortest decimal (0.3, not 0.30000001192092896).
double Decimal(float x) { return std::stod(ShortestDecimal(x)); }

// HF's module for rows [row0, row0 + rows) of keel's product `t` in block l.
struct HfModule {
  std::string name;  // without "base_model.model."
  int row0, rows;
};

std::vector<HfModule> HfModules(const model::ModelConfig& cfg, model::LoraTarget t, int l) {
  const std::string L = std::to_string(l);
  const auto [in, out] = model::LoraDims(cfg, t);
  if (!cfg.llama()) {
    const std::string h = "transformer.h." + L + ".";
    const char* m = t == model::kLoraQkv    ? "attn.c_attn"
                    : t == model::kLoraProj ? "attn.c_proj"
                    : t == model::kLoraFc   ? "mlp.c_fc"
                                            : "mlp.c_proj";
    return {{h + m, 0, out}};
  }
  const std::string h = "model.layers." + L + ".";
  const int q = cfg.n_head * cfg.head_size(), kv = cfg.kv_heads() * cfg.head_size();
  const int F = cfg.ffn();
  switch (t) {
    case model::kLoraQkv:
      return {{h + "self_attn.q_proj", 0, q},
              {h + "self_attn.k_proj", q, kv},
              {h + "self_attn.v_proj", q + kv, kv}};
    case model::kLoraProj:
      return {{h + "self_attn.o_proj", 0, out}};
    case model::kLoraFc:
      return {{h + "mlp.gate_proj", 0, F}, {h + "mlp.up_proj", F, F}};
    case model::kLoraFcProj:
      return {{h + "mlp.down_proj", 0, out}};
  }
  return {};
}

}  // namespace

void WritePeftAdapter(const std::string& dir, const model::ModelConfig& cfg,
                      const float* adapters) {
  KEEL_CHECK(cfg.lora_rank > 0, "WritePeftAdapter: the model has no adapters");
  const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
  const int r = cfg.lora_rank;
  SafetensorsWriter w;
  std::vector<std::string> modules;  // HF's target_modules: the last name part
  for (model::LoraTarget t : model::kLoraTargets) {
    if (!(cfg.lora_targets & t)) continue;
    for (const HfModule& hf : HfModules(cfg, t, 0)) {
      const std::string last = hf.name.substr(hf.name.rfind('.') + 1);
      if (std::find(modules.begin(), modules.end(), last) == modules.end()) modules.push_back(last);
    }
    for (int l = 0; l < cfg.n_layer; ++l) {
      const std::string m = "h." + std::to_string(l) + "." + model::LoraModule(cfg.llama(), t);
      const float* A = adapters + layout.Find(m + ".lora_A.weight").grad_offset;
      const float* B = adapters + layout.Find(m + ".lora_B.weight").grad_offset;
      const int in = model::LoraDims(cfg, t).first;
      for (const HfModule& hf : HfModules(cfg, t, l)) {
        const std::string name = "base_model.model." + hf.name;
        w.Add(name + ".lora_A.weight", {r, in}, A);
        w.Add(name + ".lora_B.weight", {hf.rows, r}, B + size_t(hf.row0) * size_t(r));
        if (cfg.lora_dora)
          w.Add(name + ".lora_magnitude_vector", {hf.rows},
                adapters + layout.Find(m + ".lora_magnitude_vector").grad_offset + hf.row0);
      }
    }
  }
  // GPT-2's c_proj is both attn.c_proj and mlp.c_proj: PEFT matches module names by their ends,
  // so a target list of "c_proj" would take both; name the adapted ones in full where it must.
  if (!cfg.llama() && std::find(modules.begin(), modules.end(), "c_proj") != modules.end() &&
      ((cfg.lora_targets & model::kLoraProj) == 0 ||
       (cfg.lora_targets & model::kLoraFcProj) == 0)) {
    std::erase(modules, std::string("c_proj"));
    modules.push_back(cfg.lora_targets & model::kLoraProj ? "attn.c_proj" : "mlp.c_proj");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) ThrowRuntime(dir + ": cannot create folder: " + ec.message());
  w.SetMetadata("format", "pt");
  w.Write(dir + "/adapter_model.safetensors");
  const nlohmann::json config = {{"peft_type", "LORA"},
                                 {"task_type", "CAUSAL_LM"},
                                 {"r", r},
                                 {"lora_alpha", Decimal(cfg.lora_alpha)},
                                 {"lora_dropout", Decimal(cfg.lora_dropout)},
                                 {"bias", "none"},
                                 {"fan_in_fan_out", !cfg.llama()},
                                 {"target_modules", modules},
                                 {"use_rslora", false},
                                 {"use_dora", cfg.lora_dora},
                                 {"inference_mode", true},
                                 {"base_model_name_or_path", nullptr}};
  WriteFileAtomic(dir + "/adapter_config.json", config.dump(2) + "\n");
}

void MergePeftAdapter(const std::string& dir, const model::ModelConfig& cfg,
                      std::vector<float>* weights) {
  KEEL_CHECK(cfg.lora_rank == 0, "MergePeftAdapter: into a model without adapters");
  const std::string config_path = dir + "/adapter_config.json";
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(ReadWholeFile(config_path));
  } catch (const std::exception& e) {
    ThrowBadInput(config_path + ": expected PEFT's adapter_config.json: " + e.what());
  }
  if (c.value("peft_type", "") != "LORA")
    ThrowBadInput(config_path + ": peft_type: expected \"LORA\", got " +
                  c.value("peft_type", nlohmann::json()).dump());
  if (!c.contains("r") || !c["r"].is_number_integer() || c["r"].get<int>() <= 0 ||
      !c.contains("lora_alpha") || !c["lora_alpha"].is_number())
    ThrowBadInput(config_path + ": expected a positive integer \"r\" and a number \"lora_alpha\"");
  // Per-module ranks and alphas would merge those modules at the wrong scale (the shapes of an
  // alpha_pattern still fit); keel's merge has one rank and one alpha. A pattern that repeats
  // them changes nothing.
  for (const auto& [key, global] : {std::pair{"alpha_pattern", c["lora_alpha"]},
                                    std::pair{"rank_pattern", c.value("r", nlohmann::json())}}) {
    if (!c.contains(key) || c[key].is_null()) continue;
    bool uniform = c[key].is_object();
    for (const auto& v : c[key]) uniform = uniform && v.is_number() && v == global;
    if (!uniform)
      ThrowBadInput(config_path + ": " + key + ": " + c[key].dump() +
                    ": per-module ranks and alphas are not supported (one r and one lora_alpha)");
  }
  if (c.contains("use_rslora") && !c["use_rslora"].is_boolean())
    ThrowBadInput(config_path + ": use_rslora: expected true or false");
  const int r = c["r"].get<int>();
  if (!c.value("use_dora", nlohmann::json(false)).is_boolean())
    ThrowBadInput(config_path + ": use_dora: expected true or false");
  const bool dora = c.value("use_dora", false);
  const double scale = c["lora_alpha"].get<double>() /
                       (c.value("use_rslora", false) ? std::sqrt(double(r)) : double(r));
  const std::string file = dir + "/adapter_model.safetensors";
  const SafetensorsFile f = SafetensorsFile::Read(file);
  const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
  const std::string prefix = "base_model.model.";
  size_t used = 0;
  for (const model::ParamInfo& p : layout.params()) {
    if (p.shape.size() != 2 || p.name.rfind("h.", 0) != 0) continue;  // block matrices only
    const std::string hf = cfg.llama() ? HfLlamaName(p.name) : HfGpt2Name(p.name);
    const std::string module = prefix + hf.substr(0, hf.size() - std::string(".weight").size());
    if (!f.Has(module + ".lora_A.weight")) continue;
    const Fp32Tensor& A = f.Get(module + ".lora_A.weight");
    const Fp32Tensor& B = f.Get(module + ".lora_B.weight");
    const int out = p.shape[0], in = p.shape[1];
    if (A.shape != std::vector<int64_t>{r, in} || B.shape != std::vector<int64_t>{out, r})
      ThrowBadInput(file + ": " + module + ": expected lora_A (" + std::to_string(r) + ", " +
                    std::to_string(in) + ") and lora_B (" + std::to_string(out) + ", " +
                    std::to_string(r) + ") for this model's " + p.name);
    float* W = weights->data() + p.offset;
    model::AddLowRank(W, B.data.data(), A.data.data(), out, in, r, scale);
    used += 2;
    if (!dora) continue;
    // PEFT's DoRA merge: each row of W + s·B·A scaled to magnitude / its norm.
    const std::string mag_name = module + ".lora_magnitude_vector";
    if (!f.Has(mag_name))
      ThrowBadInput(file + ": " + mag_name + ": missing (adapter_config.json says use_dora)");
    const Fp32Tensor& mag = f.Get(mag_name);
    if (mag.shape != std::vector<int64_t>{out})
      ThrowBadInput(file + ": " + mag_name + ": expected (" + std::to_string(out) +
                    ") for this model's " + p.name);
    model::DoraRescaleRows(W, mag.data.data(), out, in);
    used += 1;
  }
  for (const auto& [name, t] : f.tensors()) {
    if (!dora && model::IsDoraMagnitude(name))
      ThrowBadInput(file + ": " + name + ": a DoRA magnitude, but " + config_path +
                    " does not say \"use_dora\": true");
    if (!model::IsLoraParam(name))
      ThrowBadInput(file + ": " + name + ": not a LoRA tensor (expected ...lora_A.weight, " +
                    "...lora_B.weight" + (dora ? ", ...lora_magnitude_vector)" : ")"));
  }
  if (used != f.tensors().size())
    ThrowBadInput(file + ": " + std::to_string(f.tensors().size() - used) + " of its " +
                  std::to_string(f.tensors().size()) + " tensors name no module of this model (a " +
                  model::FamilyName(cfg.family) + " with " + std::to_string(cfg.n_layer) +
                  " layers)");
}

}  // namespace keel::ckpt

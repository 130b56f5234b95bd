#include "keel/ckpt/hf_llama.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "keel/ckpt/hf_gpt2.h"
#include "keel/ckpt/safetensors.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/validate.h"

namespace keel::ckpt {
namespace {

namespace fs = std::filesystem;

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool Vocabulary(const std::string& keel_name) {
  return keel_name == "wte.weight" || keel_name == "lm_head.weight";
}

nlohmann::json ReadJson(const std::string& path) {
  try {
    return nlohmann::json::parse(ReadWholeFile(path));
  } catch (const nlohmann::json::exception& e) {
    ThrowBadInput(path + ": not valid JSON (" + e.what() + ")");
  }
}

// config.json → keel's shape; one line naming the key for anything keel cannot run.
model::ModelConfig ConfigFromJson(const nlohmann::json& j, const std::string& where) {
  auto integer = [&](const char* key, int fallback) {
    if (!j.contains(key) || j.at(key).is_null()) {
      if (fallback >= 0) return fallback;
      ThrowBadInput(where + ": " + key + ": missing (expected an integer)");
    }
    if (!j.at(key).is_number_integer() || j.at(key).get<int64_t>() < 0 ||
        j.at(key).get<int64_t>() > INT_MAX)
      ThrowBadInput(where + ": " + key + ": expected an integer in [0, 2^31), got " +
                    j.at(key).dump());
    return j.at(key).get<int>();
  };
  auto number = [&](const char* key, double fallback) {
    if (!j.contains(key) || j.at(key).is_null()) return fallback;
    if (!j.at(key).is_number())
      ThrowBadInput(where + ": " + key + ": expected a number, got " + j.at(key).dump());
    return j.at(key).get<double>();
  };
  auto refuse_true = [&](const char* key, const char* what) {
    if (j.contains(key) && j.at(key).is_boolean() && j.at(key).get<bool>())
      ThrowBadInput(where + ": " + key + ": " + what +
                    " are not supported (keel's Llama has none)");
  };
  if (!j.is_object()) ThrowBadInput(where + ": expected a JSON object");
  if (!j.contains("model_type") || j.at("model_type") != "llama")
    ThrowBadInput(where + ": model_type: expected \"llama\", got " +
                  (j.contains("model_type") ? j.at("model_type").dump() : "nothing"));
  if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null())
    ThrowBadInput(where + ": rope_scaling: " + j.at("rope_scaling").dump() +
                  ": scaled rotary positions (Llama 3.1's long context) are not supported");
  // transformers 5 writes the rotary settings as rope_parameters (rope_type, rope_theta) instead
  // of rope_theta and rope_scaling: read past, its base silently became the default 10000.
  std::optional<double> rope_theta;
  if (j.contains("rope_parameters") && !j.at("rope_parameters").is_null()) {
    const nlohmann::json& rp = j.at("rope_parameters");
    if (!rp.is_object() || (rp.contains("rope_type") && rp.at("rope_type") != "default"))
      ThrowBadInput(where + ": rope_parameters: " + rp.dump() +
                    ": only rope_type \"default\" is supported (scaled rotary positions, as "
                    "Llama 3.1's long context, are not)");
    if (rp.contains("rope_theta")) {
      if (!rp.at("rope_theta").is_number())
        ThrowBadInput(where + ": rope_parameters.rope_theta: expected a number, got " +
                      rp.at("rope_theta").dump());
      rope_theta = rp.at("rope_theta").get<double>();
      if (j.contains("rope_theta") && j.at("rope_theta").is_number() &&
          j.at("rope_theta").get<double>() != *rope_theta)
        ThrowBadInput(where + ": rope_theta " + j.at("rope_theta").dump() +
                      " and rope_parameters.rope_theta " + rp.at("rope_theta").dump() +
                      " disagree");
    }
  }
  refuse_true("attention_bias", "attention biases");
  refuse_true("mlp_bias", "MLP biases");
  if (j.contains("hidden_act") && j.at("hidden_act") != "silu")
    ThrowBadInput(where + ": hidden_act: expected \"silu\" (SwiGLU), got " +
                  j.at("hidden_act").dump());
  model::ModelConfig c;
  c.family = model::Family::kLlama;
  c.n_embd = integer("hidden_size", -1);
  c.ffn_hidden = integer("intermediate_size", -1);
  c.n_head = integer("num_attention_heads", -1);
  c.n_layer = integer("num_hidden_layers", -1);
  // A layer costs bookkeeping beyond its floats (names, offsets): a typo of 10^6 layers would
  // take gigabytes before a tensor is read. No model keel can run is that deep.
  if (c.n_layer > 4096)
    ThrowBadInput(where + ": num_hidden_layers: " + std::to_string(c.n_layer) +
                  " is more than keel runs (at most 4096)");
  c.vocab_size = integer("vocab_size", -1);
  c.n_kv_head = integer("num_key_value_heads", c.n_head);
  c.block_size = integer("max_position_embeddings", 2048);
  c.rope_theta = float(rope_theta ? *rope_theta : number("rope_theta", 10000.0));
  c.norm_eps = float(number("rms_norm_eps", 1e-6));  // LlamaConfig's default
  if (c.n_head > 0 && j.contains("head_dim") && !j.at("head_dim").is_null() &&
      integer("head_dim", -1) != c.n_embd / c.n_head)
    ThrowBadInput(where + ": head_dim: " + j.at("head_dim").dump() +
                  " is not hidden_size / num_attention_heads (" +
                  std::to_string(c.n_embd / c.n_head) + "); keel cannot run it");
  try {
    model::Validate(c);
  } catch (const Error& e) {
    ThrowBadInput(where + ": " + e.what());
  }
  return c;
}

// A whole model in fp32, sized before anything is allocated (a hidden_size of 10^9 is a typo, not
// a model), in doubles so that the product cannot wrap. A tensor at a time needs no such check.
void CheckWholeFits(const model::ModelConfig& c, const std::string& where) {
  const double C = c.n_embd, F = c.ffn_hidden, L = c.n_layer, V = c.vocab_size;
  const double kv = double(c.n_kv_head) / double(c.n_head);
  CheckAllocation(where + ": a Llama of hidden_size " + std::to_string(c.n_embd) + ", " +
                      std::to_string(c.n_layer) + " layers and vocab_size " +
                      std::to_string(c.vocab_size),
                  4.0 * (L * (C * C * (2 + 2 * kv) + 3 * C * F + 2 * C) + 2 * V * C + C));
}

// The shard files of a folder: those of model.safetensors.index.json, else model.safetensors.
std::vector<std::string> ShardFiles(const std::string& dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    const fs::path single = fs::path(dir) / "model.safetensors";
    if (!fs::exists(single))
      ThrowBadInput(dir + ": no model.safetensors or model.safetensors.index.json");
    return {single.string()};
  }
  // A tensor named twice in weight_map would be taken from whichever copy came last.
  std::string twice;
  bool in_map = false;
  std::set<std::string> keys;
  const nlohmann::json::parser_callback_t note = [&](int depth, nlohmann::json::parse_event_t ev,
                                                     nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1) {
      in_map = parsed == "weight_map";
    } else if (ev == nlohmann::json::parse_event_t::key && depth == 2 && in_map) {
      if (!keys.insert(parsed.get<std::string>()).second && twice.empty())
        twice = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ReadWholeFile(index.string()), note);
  } catch (const nlohmann::json::exception& e) {
    ThrowBadInput(index.string() + ": not valid JSON (" + e.what() + ")");
  }
  if (!twice.empty())
    ThrowBadInput(index.string() + ": weight_map: tensor \"" + twice +
                  "\" is listed twice (expected each tensor in one file)");
  if (!j.contains("weight_map") || !j.at("weight_map").is_object())
    ThrowBadInput(index.string() + ": weight_map: expected an object of tensor name → file");
  std::set<std::string> files;
  for (const auto& [name, file] : j.at("weight_map").items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      ThrowBadInput(index.string() + ": weight_map." + name +
                    ": expected a file name in the folder, got " + file.dump());
    files.insert((fs::path(dir) / file.get<std::string>()).string());
  }
  return {files.begin(), files.end()};
}

}  // namespace

std::string HfLlamaName(const std::string& keel_name) {
  static const std::map<std::string, std::string> kTop = {
      {"wte.weight", "model.embed_tokens.weight"},
      {"ln_f.weight", "model.norm.weight"},
      {"lm_head.weight", "lm_head.weight"}};
  if (auto it = kTop.find(keel_name); it != kTop.end()) return it->second;
  // h.L.REST
  const size_t dot = keel_name.find('.', 2);
  const std::string layer = keel_name.substr(2, dot - 2), rest = keel_name.substr(dot + 1);
  static const std::map<std::string, std::string> kBlock = {
      {"ln_1.weight", "input_layernorm.weight"},
      {"ln_2.weight", "post_attention_layernorm.weight"}};
  std::string hf = rest;
  if (auto it = kBlock.find(rest); it != kBlock.end())
    hf = it->second;
  else if (rest.rfind("attn.", 0) == 0)
    hf = "self_attn." + rest.substr(5);
  return "model.layers." + layer + "." + hf;
}

bool IsHfLlamaFolder(const std::string& path) {
  const fs::path config = fs::path(path) / "config.json";
  if (!fs::is_directory(path) || !fs::exists(config)) return false;
  try {
    return nlohmann::json::parse(ReadWholeFile(config.string())).value("model_type", "") == "llama";
  } catch (const std::exception&) {
    return false;
  }
}

TensorSource OpenHfLlama(const std::string& dir) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const nlohmann::json config = ReadJson(config_path);
  const model::ModelConfig cfg = ConfigFromJson(config, config_path);
  if (config.contains("tie_word_embeddings") && !config.at("tie_word_embeddings").is_boolean() &&
      !config.at("tie_word_embeddings").is_null())
    ThrowBadInput(config_path + ": tie_word_embeddings: expected true or false, got " +
                  config.at("tie_word_embeddings").dump());
  const bool tied = config.value("tie_word_embeddings", false);
  const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
  std::map<std::string, const model::ParamInfo*> wanted;  // HF name → keel tensor
  for (const model::ParamInfo& p : layout.params())
    if (!(tied && p.name == "lm_head.weight")) wanted[HfLlamaName(p.name)] = &p;
  // keel name → the shard that holds it and its HF name; every header checked before any data.
  struct Where {
    std::shared_ptr<const SafetensorsIndex> file;
    std::string hf;
  };
  auto found = std::make_shared<std::map<std::string, Where>>();
  std::map<std::string, std::string> seen;  // HF name → the file it came from
  for (const std::string& file : ShardFiles(dir)) {
    auto f = std::make_shared<const SafetensorsIndex>(SafetensorsIndex::Open(file));
    for (const auto& [name, t] : f->entries()) {
      auto it = wanted.find(name);
      if (it == wanted.end()) {
        if (name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // a buffer
        ThrowBadInput(file + ": tensor \"" + name + "\": not part of a Llama of " +
                      std::to_string(cfg.n_layer) + " layers");
      }
      const model::ParamInfo& p = *it->second;
      std::vector<int64_t> want(p.shape.begin(), p.shape.end());
      if (Vocabulary(p.name)) want[0] = cfg.vocab_size;
      if (t.shape != want)
        ThrowBadInput(file + ": tensor \"" + name + "\": expected shape " + ShapeText(want) +
                      ", got " + ShapeText(t.shape));
      if (const auto s = seen.find(name); s != seen.end())
        ThrowBadInput(file + ": tensor \"" + name + "\": also in " + s->second +
                      " (expected each tensor in one file; which copy is meant?)");
      seen.emplace(name, file);
      (*found)[p.name] = {f, name};
    }
  }
  for (const auto& [name, p] : wanted)
    if (!seen.count(name))
      ThrowBadInput(dir + ": no tensor \"" + name + "\" in its safetensors files");
  // A tied folder's lm_head starts as a copy of its embedding; padded vocabulary rows stay zero.
  if (tied) (*found)["lm_head.weight"] = (*found)["wte.weight"];
  return TensorSource(cfg, [found](const model::ParamInfo& p, float* out) {
    const Where& w = found->at(p.name);
    const size_t n = w.file->Get(w.hf).numel;
    // host: a tensor read from a file into host memory
    std::fill(out + n, out + p.numel, 0.0f);
    w.file->ReadInto(w.hf, out);
  });
}

LoadedModel ReadHfLlama(const std::string& dir) {
  // The whole model's size first: a typo'd shape is refused before any shard is opened.
  const std::string config_path = (fs::path(dir) / "config.json").string();
  CheckWholeFits(ConfigFromJson(ReadJson(config_path), config_path), config_path);
  const TensorSource src = OpenHfLlama(dir);
  LoadedModel m;
  m.config = src.config();
  m.weights.resize(src.layout().total());
  for (const model::ParamInfo& p : src.layout().params())
    src.Read(p.name, m.weights.data() + p.offset);
  return m;
}

void WriteHfLlama(const std::string& path, const model::ModelConfig& cfg,
                  const model::ParamLayout& layout, const float* master) {
  SafetensorsWriter w;
  for (const model::ParamInfo& p : layout.params()) {
    std::vector<int64_t> shape(p.shape.begin(), p.shape.end());
    if (Vocabulary(p.name)) shape[0] = cfg.vocab_size;  // the real rows come first
    w.Add(HfLlamaName(p.name), shape, master + p.offset);
  }
  w.SetMetadata("format", "pt");
  w.Write(path);
  const nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                            {"model_type", "llama"},
                            {"hidden_size", cfg.n_embd},
                            {"intermediate_size", cfg.ffn()},
                            {"num_attention_heads", cfg.n_head},
                            {"num_key_value_heads", cfg.kv_heads()},
                            {"num_hidden_layers", cfg.n_layer},
                            {"vocab_size", cfg.vocab_size},
                            {"max_position_embeddings", cfg.block_size},
                            {"rope_theta", cfg.rope_theta},
                            {"rms_norm_eps", cfg.norm_eps},
                            {"hidden_act", "silu"},
                            {"attention_bias", false},
                            {"mlp_bias", false},
                            {"rope_scaling", nullptr},
                            {"tie_word_embeddings", false},
                            {"torch_dtype", "float32"}};
  WriteFileAtomic(ConfigBeside(path), j.dump(2) + "\n");
}

}  // namespace keel::ckpt

#include "keel/ckpt/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "keel/ckpt/safetensors.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"

namespace keel::ckpt {
namespace {

constexpr const char* kPrefix = "transformer.";

// The matrices HF's Conv1D holds as [in, out]: every 2-D tensor inside a block.
bool IsConv1D(const model::ParamInfo& p) {
  return p.shape.size() == 2 && p.name.rfind("h.", 0) == 0;
}

// src [rows, cols] → dst [cols, rows].
void Transpose(float* dst, const float* src, size_t rows, size_t cols) {
  constexpr size_t kTile = 32;
  for (size_t r0 = 0; r0 < rows; r0 += kTile)
    for (size_t c0 = 0; c0 < cols; c0 += kTile)
      for (size_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (size_t c = c0; c < std::min(cols, c0 + kTile); ++c)
          dst[c * rows + r] = src[r * cols + c];
}

std::string ShapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The shape the file must hold for a keel parameter, given the config read from the file.
std::vector<int64_t> HfShape(const model::ParamInfo& p, const model::ModelConfig& cfg) {
  std::vector<int64_t> s(p.shape.begin(), p.shape.end());
  if (p.name == "wte.weight") s[0] = cfg.vocab_size;
  if (IsConv1D(p)) std::swap(s[0], s[1]);
  return s;
}

// HF's GPT-2 checkpoints also carry the causal mask as buffers ("h.0.attn.bias" [1,1,T,T],
// "h.0.attn.masked_bias"): not parameters, recomputed by keel.
bool IsMaskBuffer(const std::string& name) {
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

// Only the header: deciding the format must not read a 6 GB file.
nlohmann::json ReadHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ThrowBadInput(path + ": cannot open (expected a .safetensors file)");
  uint64_t hlen = 0;
  if (!in.read(reinterpret_cast<char*>(&hlen), 8))
    ThrowBadInput(path + ": shorter than the 8-byte header length");
  if (hlen > (uint64_t(1) << 30))
    ThrowBadInput(path + ": header length " + std::to_string(hlen) + " is not plausible");
  std::string h(hlen, '\0');
  if (!in.read(h.data(), std::streamsize(hlen)))
    ThrowBadInput(path + ": header runs past the end of the file");
  try {
    return nlohmann::json::parse(h);
  } catch (const std::exception& e) {
    ThrowBadInput(path + ": header is not valid JSON (" + e.what() + ")");
  }
}

// A Hugging Face folder's config.json (beside model.safetensors, whose metadata holds only
// {"format": "pt"}): its n_head (0 when it has none or there is no such folder), after refusing
// the settings keel's GPT-2 does not compute (its attention and GELU would differ in silence).
int HeadsFromFolderConfig(const std::string& path) {
  if (std::filesystem::path(path).filename() != "model.safetensors") return 0;
  const std::string config = ConfigBeside(path);
  if (!std::filesystem::exists(config)) return 0;
  const nlohmann::json j = nlohmann::json::parse(ReadWholeFile(config), nullptr, false);
  if (!j.is_object() || !j.contains("model_type") || j.at("model_type") != "gpt2")
    return 0;  // another model's
  auto refuse = [&](const char* key, const std::string& what) {
    ThrowBadInput(config + ": " + key + ": " + j.at(key).dump() + ": " + what +
                  " (keel's GPT-2 computes the tanh GELU, attention scaled by 1/sqrt(head size) "
                  "and LayerNorm epsilon 1e-5)");
  };
  if (j.contains("activation_function") && j.at("activation_function") != "gelu_new" &&
      j.at("activation_function") != "gelu_pytorch_tanh")
    refuse("activation_function", "not the tanh GELU");
  // A flag other than the default (or not a boolean at all) is refused.
  auto flag_is = [&](const char* key, bool fallback) {
    return !j.contains(key) || j.at(key).is_null() || j.at(key) == fallback;
  };
  if (!flag_is("scale_attn_by_inverse_layer_idx", false))
    refuse("scale_attn_by_inverse_layer_idx", "attention scaled per layer");
  if (!flag_is("scale_attn_weights", true)) refuse("scale_attn_weights", "unscaled attention");
  if (j.contains("layer_norm_epsilon") &&
      (!j.at("layer_norm_epsilon").is_number() ||
       std::abs(j.at("layer_norm_epsilon").get<double>() - 1e-5) > 1e-12))
    refuse("layer_norm_epsilon", "another epsilon");
  if (!j.contains("n_head")) return 0;
  if (!j.at("n_head").is_number_integer() || j.at("n_head").get<int>() <= 0)
    refuse("n_head", "expected a positive integer");
  return j.at("n_head").get<int>();
}

// n_head from the metadata, the folder's config.json, the GPT-2 family's widths, or the caller,
// in that order; a caller's value that contradicts the metadata or the config is an error rather
// than a silent choice.
int ResolveHeads(const std::string& path, const std::map<std::string, std::string>& meta,
                 int n_embd, int n_head_arg) {
  for (const char* key : {"n_head", "keel.n_head"}) {
    auto it = meta.find(key);
    if (it == meta.end()) continue;
    int v = 0;
    try {
      v = std::stoi(it->second);
    } catch (const std::exception&) {
      ThrowBadInput(path + ": metadata \"" + key + "\": expected an integer, got \"" + it->second +
                    "\"");
    }
    if (n_head_arg > 0 && n_head_arg != v)
      ThrowBadInput(path + ": metadata says n_head " + std::to_string(v) + ", but " + "n_head " +
                    std::to_string(n_head_arg) + " was given");
    return v;
  }
  if (const int v = HeadsFromFolderConfig(path); v > 0) {
    if (n_head_arg > 0 && n_head_arg != v)
      ThrowBadInput(ConfigBeside(path) + " says n_head " + std::to_string(v) + ", but n_head " +
                    std::to_string(n_head_arg) + " was given");
    return v;
  }
  if (n_head_arg > 0) return n_head_arg;
  static const std::map<int, int> kGpt2Heads = {{768, 12}, {1024, 16}, {1280, 20}, {1600, 25}};
  auto it = kGpt2Heads.find(n_embd);
  if (it != kGpt2Heads.end()) return it->second;
  ThrowBadInput(path + ": n_embd " + std::to_string(n_embd) +
                " is not a GPT-2 size and the file does not say n_head; give it (--n-head N)");
}

}  // namespace

std::string HfGpt2Name(const std::string& keel_name) { return kPrefix + keel_name; }

void WriteHfGpt2(const std::string& path, const model::ModelConfig& cfg,
                 const model::ParamLayout& layout, const float* master) {
  SafetensorsWriter w;
  std::vector<std::vector<float>> transposed;  // alive until Write
  transposed.reserve(4 * size_t(cfg.n_layer));
  for (const auto& p : layout.params()) {
    const std::vector<int64_t> shape = HfShape(p, cfg);
    const float* src = master + p.offset;
    if (IsConv1D(p)) {
      transposed.emplace_back(p.numel);
      Transpose(transposed.back().data(), src, size_t(p.shape[0]), size_t(p.shape[1]));
      src = transposed.back().data();
    }
    // wte's real rows come first, so dropping the padding is a shorter shape, not a copy.
    w.Add(HfGpt2Name(p.name), shape, src);
  }
  w.SetMetadata("format", "pt");  // what transformers' save_pretrained writes
  w.SetMetadata("n_head", std::to_string(cfg.n_head));
  w.Write(path);
  const nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                            {"model_type", "gpt2"},
                            {"n_embd", cfg.n_embd},
                            {"n_head", cfg.n_head},
                            {"n_layer", cfg.n_layer},
                            {"n_positions", cfg.block_size},
                            {"n_ctx", cfg.block_size},
                            {"vocab_size", cfg.vocab_size},
                            {"activation_function", "gelu_new"},
                            {"layer_norm_epsilon", 1e-5},
                            {"tie_word_embeddings", true},
                            {"torch_dtype", "float32"}};
  WriteFileAtomic(ConfigBeside(path), j.dump(2) + "\n");
}

std::string ConfigBeside(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return (parent.empty() ? std::filesystem::path("config.json") : parent / "config.json").string();
}

bool IsHfGpt2File(const std::string& path) {
  const nlohmann::json h = ReadHeader(path);
  auto meta = h.find("__metadata__");
  if (meta != h.end() && meta->is_object()) {
    auto fmt = meta->find("format");
    if (fmt != meta->end() && fmt->is_string() && fmt->get<std::string>() == "keel-model")
      return false;
  }
  return true;
}

LoadedModel ReadHfGpt2(const std::string& path, int n_head) {
  const SafetensorsFile f = SafetensorsFile::Read(path);
  const std::string prefix = f.Has(std::string(kPrefix) + "wte.weight") ? kPrefix : "";
  auto where = [&](const std::string& name) { return path + ": tensor \"" + name + "\""; };
  auto get = [&](const std::string& keel_name) -> const Fp32Tensor& {
    const std::string name = prefix + keel_name;
    if (!f.Has(name))
      ThrowBadInput(path + ": no tensor \"" + name + "\" (expected a Hugging Face GPT-2 model)");
    return f.Get(name);
  };

  // The shapes that define the config: wte [V, C], wpe [T, C], and the number of blocks.
  const Fp32Tensor& wte = get("wte.weight");
  const Fp32Tensor& wpe = get("wpe.weight");
  if (wte.shape.size() != 2)
    ThrowBadInput(where(prefix + "wte.weight") + ": expected 2 dimensions, got shape " +
                  ShapeText(wte.shape));
  if (wpe.shape.size() != 2 || wpe.shape[1] != wte.shape[1])
    ThrowBadInput(where(prefix + "wpe.weight") + ": expected shape [block_size, " +
                  std::to_string(wte.shape[1]) + "], got " + ShapeText(wpe.shape));
  int n_layer = 0;
  while (f.Has(prefix + "h." + std::to_string(n_layer) + ".ln_1.weight")) ++n_layer;
  if (n_layer == 0)
    ThrowBadInput(path + ": no tensor \"" + prefix + "h.0.ln_1.weight\" (no blocks)");

  LoadedModel m;
  m.config.n_layer = n_layer;
  m.config.n_embd = int(wte.shape[1]);
  m.config.vocab_size = int(wte.shape[0]);
  m.config.block_size = int(wpe.shape[0]);
  m.config.n_head = ResolveHeads(path, f.metadata(), m.config.n_embd, n_head);
  if (m.config.n_head <= 0 || m.config.n_embd % m.config.n_head != 0)
    ThrowBadInput(path + ": n_embd " + std::to_string(m.config.n_embd) +
                  " is not a multiple of n_head " + std::to_string(m.config.n_head));
  try {
    model::Validate(m.config);
  } catch (const Error& e) {
    ThrowBadInput(path + ": the shapes its tensors give: " + e.what());
  }

  const auto layout = model::ParamLayout::Whole(m.config);
  m.weights.assign(layout.total(), 0.0f);  // the padded wte rows stay zero
  std::set<std::string> used;
  for (const auto& p : layout.params()) {
    const std::string name = prefix + p.name;
    const Fp32Tensor& t = get(p.name);
    const std::vector<int64_t> want = HfShape(p, m.config);
    if (t.shape != want)
      ThrowBadInput(where(name) + ": expected shape " + ShapeText(want) + ", got " +
                    ShapeText(t.shape));
    float* dst = m.weights.data() + p.offset;
    if (IsConv1D(p))
      Transpose(dst, t.data.data(), size_t(want[0]), size_t(want[1]));
    else
      std::copy(t.data.begin(), t.data.end(), dst);
    used.insert(name);
  }

  // keel ties the classifier to wte; an untied head would be silently dropped, so refuse it.
  if (f.Has("lm_head.weight")) {
    const Fp32Tensor& head = f.Get("lm_head.weight");
    if (head.shape != wte.shape)
      ThrowBadInput(where("lm_head.weight") + ": expected shape " + ShapeText(wte.shape) +
                    " (tied to wte), got " + ShapeText(head.shape));
    if (head.data != wte.data)
      ThrowBadInput(where("lm_head.weight") +
                    ": differs from wte; keel ties the classifier to wte and cannot load an "
                    "untied head");
    used.insert("lm_head.weight");
  }
  for (const auto& [name, t] : f.tensors())
    if (!used.count(name) && !IsMaskBuffer(name))
      ThrowBadInput(where(name) + ": not part of a GPT-2 model with " + std::to_string(n_layer) +
                    " blocks (is this a GPT-2 checkpoint?)");
  return m;
}

}  // namespace keel::ckpt

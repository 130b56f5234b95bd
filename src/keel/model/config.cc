#include "keel/model/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>

#include "keel/core/error.h"

namespace keel::model {
namespace {

ModelConfig Llama(int n_layer, int n_head, int n_kv_head, int n_embd, int ffn_hidden,
                  int vocab_size, int block_size, float rope_theta) {
  ModelConfig c{n_layer, n_head, n_embd, vocab_size, block_size};
  c.family = Family::kLlama;
  c.n_kv_head = n_kv_head;
  c.ffn_hidden = ffn_hidden;
  c.rope_theta = rope_theta;
  return c;
}

const std::map<std::string, ModelConfig>& Table() {
  // The small Llamas keep GPT-2's vocabulary so that they train on the same token shards.
  static const std::map<std::string, ModelConfig> table = {
      {"gpt2-tiny", {2, 2, 32, 50257, 64}},
      {"gpt2-mini", {4, 4, 256, 50257, 256}},
      {"gpt2-small6", {6, 6, 384, 50257, 1024}},
      {"gpt2", {12, 12, 768, 50257, 1024}},
      {"gpt2-medium", {24, 16, 1024, 50257, 1024}},
      {"gpt2-large", {36, 20, 1280, 50257, 1024}},
      {"gpt2-xl", {48, 25, 1600, 50257, 1024}},
      {"llama-tiny", Llama(2, 4, 2, 64, 176, 50257, 64, 10000)},
      {"llama-mini", Llama(4, 4, 2, 256, 688, 50257, 256, 10000)},
      {"llama-120m", Llama(12, 12, 4, 768, 2048, 50257, 1024, 10000)},
      {"tinyllama-1.1b", Llama(22, 32, 4, 2048, 5632, 32000, 2048, 10000)},
      {"llama3-8b", Llama(32, 32, 8, 4096, 14336, 128256, 8192, 500000)},
  };
  return table;
}

int ParseInt(const std::string& key, const std::string& v, const std::string& where) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < 0 || x > (1L << 30))
    ThrowBadInput(where + ": " + key + ": expected a non-negative integer, got \"" + v + "\"");
  return int(x);
}

float ParseFloat(const std::string& key, const std::string& v, const std::string& where) {
  char* end = nullptr;
  const float x = std::strtof(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x <= 0)
    ThrowBadInput(where + ": " + key + ": expected a positive number, got \"" + v + "\"");
  return x;
}

std::string Text(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(x));
  return buf;
}

}  // namespace

const char* FamilyName(Family f) { return f == Family::kLlama ? "llama" : "gpt2"; }

namespace {

// A LoRA target's module (its adapters' names) and the first tensor of the weight it adapts (the
// fused products' parts are adjacent rows: Llama's q, k, v; gate, up), per family.
struct LoraNames {
  const char *gpt2_module, *llama_module, *gpt2_weight, *llama_weight;
};
const LoraNames& NamesOf(LoraTarget t) {
  static const LoraNames kNames[] = {
      {"attn.c_attn", "attn.qkv", "attn.c_attn.weight", "attn.q_proj.weight"},
      {"attn.c_proj", "attn.o_proj", "attn.c_proj.weight", "attn.o_proj.weight"},
      {"mlp.c_fc", "mlp.gate_up", "mlp.c_fc.weight", "mlp.gate_proj.weight"},
      {"mlp.c_proj", "mlp.down_proj", "mlp.c_proj.weight", "mlp.down_proj.weight"}};
  return kNames[t == kLoraQkv ? 0 : t == kLoraProj ? 1 : t == kLoraFc ? 2 : 3];
}

}  // namespace

const char* LoraModule(bool llama, LoraTarget t) {
  return llama ? NamesOf(t).llama_module : NamesOf(t).gpt2_module;
}

const char* LoraBaseWeight(bool llama, LoraTarget t) {
  return llama ? NamesOf(t).llama_weight : NamesOf(t).gpt2_weight;
}

unsigned ParseLoraTargets(bool llama, const std::string& text, const std::string& key) {
  unsigned bits = 0;
  std::string known;
  for (LoraTarget t : kLoraTargets)
    known += std::string(known.empty() ? "" : ", ") + LoraModule(llama, t);
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    std::string name = text.substr(at, end - at);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    at = end + 1;
    if (name.empty()) continue;
    if (name == "all") {
      bits |= kLoraQkv | kLoraProj | kLoraFc | kLoraFcProj;
      continue;
    }
    unsigned hit = 0;
    for (LoraTarget t : kLoraTargets) {
      const std::string module = LoraModule(llama, t);
      // The full name, or its last part where only one module has it (GPT-2's c_proj is two).
      const std::string last = module.substr(module.find('.') + 1);
      if (name == module || (name == last && !(name == "c_proj" && !llama))) hit |= t;
    }
    if (!hit)
      ThrowBadInput(key + ": unknown module \"" + name + "\" for a " + (llama ? "Llama" : "GPT-2") +
                    " (expected some of " + known + ", or all)");
    bits |= hit;
  }
  if (!bits) ThrowBadInput(key + ": expected at least one module (" + known + ", or all)");
  return bits;
}

std::string LoraTargetsText(const ModelConfig& c) {
  std::string out;
  for (LoraTarget t : kLoraTargets)
    if (c.lora_targets & t) out += std::string(out.empty() ? "" : ",") + LoraModule(c.llama(), t);
  return out;
}

ModelConfig BaseModel(ModelConfig c) {
  c.lora_rank = 0;
  c.lora_alpha = 0;
  c.lora_targets = 0;
  c.lora_base = BaseQuant::kNone;
  c.lora_dora = false;
  return c;
}

const char* BaseQuantName(BaseQuant q) {
  return q == BaseQuant::kInt8 ? "int8" : q == BaseQuant::kNf4 ? "nf4" : "none";
}

BaseQuant ParseBaseQuant(const std::string& text, const std::string& key) {
  if (text.empty() || text == "none") return BaseQuant::kNone;
  if (text == "int8") return BaseQuant::kInt8;
  if (text == "nf4") return BaseQuant::kNf4;
  ThrowBadInput(key + ": expected \"none\", \"int8\" or \"nf4\", got \"" + text + "\"");
}

void Validate(const ModelConfig& c) {
  auto positive = [](const char* key, int v) {
    if (v <= 0)
      ThrowBadInput(std::string("[model] ") + key + ": expected a positive integer, got " +
                    std::to_string(v));
  };
  positive("n_layer", c.n_layer);
  positive("n_head", c.n_head);
  positive("n_embd", c.n_embd);
  positive("vocab_size", c.vocab_size);
  positive("block_size", c.block_size);
  if (c.n_embd % c.n_head != 0)
    ThrowBadInput("[model] n_embd: expected a multiple of n_head = " + std::to_string(c.n_head) +
                  ", got " + std::to_string(c.n_embd));
  if (c.lora_rank < 0)
    ThrowBadInput("[lora] rank: expected 0 (off) or a positive integer, got " +
                  std::to_string(c.lora_rank));
  if (c.lora_rank > 0 && (!(c.lora_alpha > 0) || !std::isfinite(c.lora_alpha)))
    ThrowBadInput("[lora] alpha: expected a positive number, got " + Text(c.lora_alpha));
  if (c.lora_rank > 0 && c.lora_targets == 0)
    ThrowBadInput("[lora] targets: expected at least one module");
  if (c.lora_base != BaseQuant::kNone && c.lora_rank == 0)
    ThrowBadInput("[lora] base: a quantized base is LoRA's frozen base; set [lora] rank");
  if (c.lora_dora && c.lora_rank == 0)
    ThrowBadInput("[lora] dora: DoRA rescales LoRA's adapted products; set [lora] rank");
  // NF4's blocks of 64 weights tile every block matrix (each has n_embd rows or columns).
  if (c.lora_base == BaseQuant::kNf4 && c.n_embd % 64 != 0)
    ThrowBadInput(
        "[lora] base: nf4 quantizes blocks of 64 weights; n_embd must be a multiple of "
        "64, got " +
        std::to_string(c.n_embd));
  if (!c.llama()) {
    if (c.n_kv_head != 0 && c.n_kv_head != c.n_head)
      ThrowBadInput("[model] n_kv_head: GPT-2 has no grouped-query attention; leave it at 0");
    if (c.ffn_hidden != 0 && c.ffn_hidden != 4 * c.n_embd)
      ThrowBadInput("[model] ffn_hidden: GPT-2's MLP is 4·n_embd wide; leave it at 0");
    return;
  }
  if (c.n_kv_head < 0 || c.n_head % c.kv_heads() != 0)
    ThrowBadInput("[model] n_kv_head: expected a divisor of n_head = " + std::to_string(c.n_head) +
                  ", got " + std::to_string(c.n_kv_head));
  if (c.head_size() % 2 != 0)
    ThrowBadInput(
        "[model] n_embd: rotary positions rotate pairs of channels, so n_embd / n_head "
        "must be even, got " +
        std::to_string(c.head_size()));
  positive("ffn_hidden", c.ffn());
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta))
    ThrowBadInput("[model] rope_theta: expected a number above 1, got " + Text(c.rope_theta));
  if (!(c.norm_eps > 0) || !(c.norm_eps < 1))
    ThrowBadInput("[model] norm_eps: expected a number in (0, 1), got " + Text(c.norm_eps));
}

std::vector<std::pair<std::string, std::string>> ShapeKeys(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::string>> keys = {
      {"family", FamilyName(c.family)},
      {"n_layer", std::to_string(c.n_layer)},
      {"n_head", std::to_string(c.n_head)},
      {"n_embd", std::to_string(c.n_embd)},
      {"vocab_size", std::to_string(c.vocab_size)},
      {"block_size", std::to_string(c.block_size)}};
  if (c.llama()) {
    keys.emplace_back("n_kv_head", std::to_string(c.kv_heads()));
    keys.emplace_back("ffn_hidden", std::to_string(c.ffn()));
    keys.emplace_back("rope_theta", Text(c.rope_theta));
    keys.emplace_back("norm_eps", Text(c.norm_eps));
  }
  // Only with adapters, so that every file without them reads as before LoRA existed.
  if (c.lora_rank > 0) {
    keys.emplace_back("lora_rank", std::to_string(c.lora_rank));
    keys.emplace_back("lora_alpha", Text(c.lora_alpha));
    keys.emplace_back("lora_targets", LoraTargetsText(c));
    if (c.lora_base != BaseQuant::kNone) keys.emplace_back("lora_base", BaseQuantName(c.lora_base));
    if (c.lora_dora) keys.emplace_back("lora_dora", "true");
  }
  return keys;
}

void SetShapeKey(ModelConfig& c, const std::string& key, const std::string& value,
                 const std::string& where) {
  if (key == "family") {
    if (value != "gpt2" && value != "llama")
      ThrowBadInput(where + ": family: expected \"gpt2\" or \"llama\", got \"" + value + "\"");
    c.family = value == "llama" ? Family::kLlama : Family::kGpt2;
  } else if (key == "rope_theta") {
    c.rope_theta = ParseFloat(key, value, where);
  } else if (key == "norm_eps") {
    c.norm_eps = ParseFloat(key, value, where);
  } else if (key == "lora_alpha") {
    c.lora_alpha = ParseFloat(key, value, where);
  } else if (key == "lora_targets") {
    c.lora_targets = ParseLoraTargets(c.llama(), value, where + ": lora_targets");
  } else if (key == "lora_base") {
    c.lora_base = ParseBaseQuant(value, where + ": lora_base");
  } else if (key == "lora_dora") {
    if (value != "true" && value != "false")
      ThrowBadInput(where + ": lora_dora: expected \"true\" or \"false\", got \"" + value + "\"");
    c.lora_dora = value == "true";
  } else {
    int* field = key == "n_layer"      ? &c.n_layer
                 : key == "n_head"     ? &c.n_head
                 : key == "n_embd"     ? &c.n_embd
                 : key == "vocab_size" ? &c.vocab_size
                 : key == "block_size" ? &c.block_size
                 : key == "n_kv_head"  ? &c.n_kv_head
                 : key == "ffn_hidden" ? &c.ffn_hidden
                 : key == "lora_rank"  ? &c.lora_rank
                                       : nullptr;
    if (field == nullptr) ThrowBadInput(where + ": unknown model key \"" + key + "\"");
    *field = ParseInt(key, value, where);
  }
}

std::optional<KeyDifference> FirstDifference(const ModelConfig& a, const ModelConfig& b) {
  const auto ka = ShapeKeys(a), kb = ShapeKeys(b);
  for (size_t i = 0; i < std::max(ka.size(), kb.size()); ++i) {
    const std::string& key = i < ka.size() ? ka[i].first : kb[i].first;
    const std::string va = i < ka.size() ? ka[i].second : "(none)";
    const std::string vb = i < kb.size() ? kb[i].second : "(none)";
    if (va != vb) return KeyDifference{key, va, vb};
  }
  return std::nullopt;
}

ModelConfig NamedConfig(const std::string& name) {
  auto it = Table().find(name);
  if (it == Table().end()) {
    std::string known;
    for (auto& [k, v] : Table()) known += (known.empty() ? "" : ", ") + k;
    ThrowBadInput("[model] name: unknown model \"" + name + "\"; known: " + known);
  }
  return it->second;
}

std::vector<std::string> NamedConfigNames() {
  std::vector<std::string> names;
  for (auto& [k, v] : Table()) names.push_back(k);
  return names;
}

}  // namespace keel::model

// Model shapes of both families and the named configurations.
//
// GPT-2: LayerNorm, learned positions, a 4·C GELU MLP, biases, the classifier tied to the token
// embedding. Llama: RMSNorm, rotary positions (θ = rope_theta), a SwiGLU MLP of ffn_hidden units,
// grouped-query attention (n_kv_head key/value heads shared by n_head/n_kv_head query heads each),
// no biases, a separate classifier (lm_head).
//
//   keel::model::ModelConfig c = keel::model::NamedConfig("gpt2");        // 124M
//   keel::model::ModelConfig l = keel::model::NamedConfig("llama-tiny");  // tests
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "keel/core/fp8.h"

namespace keel::model {

enum class Family { kGpt2, kLlama };
const char* FamilyName(Family f);  // "gpt2" | "llama"

// A frozen base's storage (ModelConfig::lora_base): the working dtype, int8 with one scale per
// output row, or NF4 (4-bit NormalFloat) with one scale per 64 weights.
enum class BaseQuant { kNone, kInt8, kNf4 };
const char* BaseQuantName(BaseQuant q);  // "none" | "int8" | "nf4"
// "none" (or ""), "int8", "nf4"; throws keel::Error (bad input) naming `key` otherwise.
BaseQuant ParseBaseQuant(const std::string& text, const std::string& key);

struct ModelConfig {
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  int vocab_size = 50257;  // the real vocabulary; padded internally (padded_vocab())
  int block_size = 1024;   // maximum context (rows of GPT-2's position embedding)
  Family family = Family::kGpt2;
  int n_kv_head = 0;         // Llama: key/value heads, dividing n_head (0: n_head, no grouping)
  int ffn_hidden = 0;        // Llama: SwiGLU's hidden units (0: 4·n_embd, GPT-2's)
  float rope_theta = 10000;  // Llama: the rotary base
  float norm_eps = 1e-5f;    // Llama: RMSNorm's ε (GPT-2's LayerNorm uses 1e-5)
  // LoRA (Hu et al. 2021): a rank-r update s·B·A beside each targeted matrix product of every
  // block (s = lora_alpha / lora_rank; A (r, in), B (out, r), B starting at zero), as extra
  // tensors of the layout (h.L.MODULE.lora_A.weight, lora_B.weight). 0: none.
  int lora_rank = 0;
  float lora_alpha = 0;
  unsigned lora_targets = 0;  // LoraTarget bits
  // How a LoRA run holds its frozen base's block matrices (QLoRA, Dettmers et al. 2023): in the
  // working dtype, or quantized (quantize.h) and dequantized into the working dtype just before
  // each product that reads them. Embeddings, norms and Llama's lm_head stay in the working dtype.
  BaseQuant lora_base = BaseQuant::kNone;
  // LoRA dropout (PEFT's lora_dropout): each adapted product's input zeroed with this probability
  // (the rest scaled by 1/(1-p)) before A, in training passes only (Transformer::SetDropout). A
  // training setting, not the model's shape: not a ShapeKeys key, not in checkpoints.
  float lora_dropout = 0;
  // DoRA (Liu et al. 2024; PEFT's use_dora): each adapted product's output rows rescaled to a
  // trained magnitude, y = m/‖W + s·B·A‖ ⊙ (x·(W + s·B·A)ᵀ) + bias, the norm per output row held
  // constant in backward; m is one more adapter tensor (h.L.MODULE.lora_magnitude_vector, fp32 in
  // every precision) that starts at ‖W‖ (of W as the products see it: dequantized where the base
  // is quantized), so that a fresh adapter is the base model (bf16 runs: up to ‖bf16(W)‖ / ‖W‖).
  bool lora_dora = false;
  // fp8 block products (train.precision = "fp8"; model/fp8_products.h): in blocks 1 … n_layer − 2
  // each product's input and weight are scaled to E4M3 and, in backward, its output gradient to
  // E5M2, by `fp8_recipe`; the first and last blocks, the embeddings and the classifier stay in
  // the working dtype (bf16). A training setting, not a ShapeKeys key.
  bool fp8 = false;
  Fp8Recipe fp8_recipe;

  bool llama() const { return family == Family::kLlama; }
  // GPT-2 ties the classifier to the token embedding; Llama has its own lm_head.
  bool tied() const { return !llama(); }
  int head_size() const { return n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * n_embd; }
  // Columns of the fused q, k, v product: n_head query heads, kv_heads() key and value heads.
  int qkv_dim() const { return (n_head + 2 * kv_heads()) * head_size(); }
  // Columns of the MLP's first product: GELU's input, or SwiGLU's gate and up halves.
  int fc_dim() const { return llama() ? 2 * ffn() : ffn(); }
  // Rows of the token embedding: the vocabulary rounded up to a multiple of 128, so that the
  // classifier's matrix products stay on fast tile sizes. The padded logits are masked.
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  float lora_scale() const { return lora_rank > 0 ? lora_alpha / float(lora_rank) : 0.0f; }
};

// A block's matrix products LoRA can adapt (keel's fused products: Llama's q, k, v are one, and
// its gate and up).
enum LoraTarget : unsigned {
  kLoraQkv = 1,     // GPT-2 attn.c_attn; Llama attn.qkv (q_proj, k_proj, v_proj)
  kLoraProj = 2,    // attn.c_proj; attn.o_proj
  kLoraFc = 4,      // mlp.c_fc; mlp.gate_up (gate_proj, up_proj)
  kLoraFcProj = 8,  // mlp.c_proj; mlp.down_proj
};
inline constexpr LoraTarget kLoraTargets[] = {kLoraQkv, kLoraProj, kLoraFc, kLoraFcProj};
// The module a target adapts, as its adapter tensors are named: "attn.c_attn", "mlp.gate_up", ...
const char* LoraModule(bool llama, LoraTarget t);
// The first tensor of the weight `t` adapts ("attn.c_attn.weight", "attn.q_proj.weight", ...): the
// fused products' parts are adjacent rows, so the product's weight starts there.
const char* LoraBaseWeight(bool llama, LoraTarget t);
// Comma-separated module names ("c_attn,c_proj", "qkv,o_proj,gate_up,down_proj", "all"; the
// "attn."/"mlp." prefix optional where unambiguous) into LoraTarget bits. Throws keel::Error (bad
// input) naming `key` and the modules this family has.
unsigned ParseLoraTargets(bool llama, const std::string& text, const std::string& key);
std::string LoraTargetsText(const ModelConfig& c);
// The shape of `c` without its adapters: what a merged model file or an init_from file holds.
ModelConfig BaseModel(ModelConfig c);

// Throws keel::Error (bad input) naming the key when shapes are inconsistent.
void Validate(const ModelConfig& c);

// Every key that describes a model, as text, in a fixed order: checkpoint and model-file metadata,
// comparisons of a saved model with a run's, the resolved config. GPT-2's omit Llama's keys.
std::vector<std::pair<std::string, std::string>> ShapeKeys(const ModelConfig& c);
// Sets one of ShapeKeys' keys from its text; throws keel::Error (bad input) naming `where` and the
// key for an unknown key or a malformed value.
void SetShapeKey(ModelConfig& c, const std::string& key, const std::string& value,
                 const std::string& where);

// The first of ShapeKeys whose value differs between `a` and `b`, with both values.
struct KeyDifference {
  std::string key, a, b;
};
std::optional<KeyDifference> FirstDifference(const ModelConfig& a, const ModelConfig& b);

// GPT-2: "gpt2-tiny" (tests), "gpt2-mini" (quickstart), "gpt2" (124M), "gpt2-medium" (350M),
// "gpt2-large" (774M), "gpt2-xl" (1.5B). Llama: "llama-tiny" (tests), "llama-mini" (quickstart),
// "llama-120m" (benchmarks), and the shapes of "tinyllama-1.1b" and "llama3-8b" (planning).
// Throws on an unknown name, listing the known ones.
ModelConfig NamedConfig(const std::string& name);
std::vector<std::string> NamedConfigNames();

}  // namespace keel::model

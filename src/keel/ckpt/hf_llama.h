// Hugging Face Llama interop: a model folder as `transformers` saves LlamaForCausalLM
// (config.json, and model.safetensors or shards listed in model.safetensors.index.json), read
// into keel's layout and written back.
//
// What differs, all handled here:
//   names   keel "h.0.attn.q_proj.weight" is HF "model.layers.0.self_attn.q_proj.weight"; "wte",
//           "ln_1", "ln_2", "ln_f" are "model.embed_tokens", "input_layernorm",
//           "post_attention_layernorm", "model.norm"; lm_head is lm_head;
//   vocab   keel pads embed_tokens and lm_head to a multiple of 128 rows; the files hold the
//           real vocabulary only;
//   tying   a folder with "tie_word_embeddings": true has no lm_head: keel's lm_head starts as a
//           copy of the embedding (keel's Llamas are untied).
// Both store nn.Linear weights [out, in], and keel rotates q and k in HF's "rotate half" layout,
// which is how HF stores Meta's weights (its conversion script permutes q_proj and k_proj once),
// so the matrices are copied as they are. Tensors are read in F32, BF16 or F16, one shard at a
// time; keel writes F32 in one file. config.json gives the shape; keys keel cannot honour
// (rope_scaling, attention or MLP biases, another activation) are refused with one line.
//
//   if (IsHfLlamaFolder(dir)) LoadedModel m = ReadHfLlama(dir);
//   WriteHfLlama("out/model.safetensors", cfg, layout, master);   // and out/config.json
#pragma once

#include <string>

#include "keel/ckpt/model_file.h"
#include "keel/model/config.h"
#include "keel/model/params.h"

namespace keel::ckpt {

// A folder with a config.json whose model_type is "llama".
bool IsHfLlamaFolder(const std::string& path);

// Throws keel::Error (bad input), one line naming the file and the key or tensor, e.g.
//   llama/config.json: rope_scaling: Llama 3.1's long-context rotary scaling is not supported
//   llama/model-00002-of-00002.safetensors: tensor "model.norm.weight": expected shape [64], got
//   [32]
LoadedModel ReadHfLlama(const std::string& dir);
// The same a tensor at a time: every config key, shard header and tensor shape checked here, the
// data read by TensorSource::Read.
TensorSource OpenHfLlama(const std::string& dir);

// Writes `master` (keel's layout for `cfg`) to `path` (F32, HF names) and config.json beside it.
void WriteHfLlama(const std::string& path, const model::ModelConfig& cfg,
                  const model::ParamLayout& layout, const float* master);

// keel's name for a Llama parameter → the HF name ("h.3.ln_2.weight" →
// "model.layers.3.post_attention_layernorm.weight").
std::string HfLlamaName(const std::string& keel_name);

}  // namespace keel::ckpt

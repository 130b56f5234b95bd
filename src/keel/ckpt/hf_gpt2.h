// Hugging Face GPT-2 interop: keel's parameters as the safetensors file `transformers` writes for
// GPT2LMHeadModel, and back.
//
// The two differ in three ways, all handled here:
//   names   keel "h.0.attn.c_attn.weight" is HF "transformer.h.0.attn.c_attn.weight" (files
//           saved from the bare GPT2Model have no "transformer." prefix; both are read);
//   layout  keel stores Linear weights [out, in]; HF's Conv1D stores them [in, out], so the four
//           matrices of each block (c_attn, attn.c_proj, c_fc, mlp.c_proj) are transposed. The
//           c_attn output order is the same in both: q, k, v, each n_embd wide;
//   vocab   keel pads wte to a multiple of 128 rows; the file holds the real vocabulary only.
// The classifier is tied to wte in both; "lm_head.weight", when a file has it, must equal wte.
// n_head is not visible in the shapes: it comes from the metadata ("n_head", which the export
// writes), else from the config.json beside a model.safetensors (a Hugging Face folder; settings
// keel's GPT-2 does not compute, as the erf GELU, are refused), else from the caller, else from
// the GPT-2 family's widths (768/1024/1280/1600 → 12/16/20/25).
//
//   WriteHfGpt2("gpt2.safetensors", cfg, layout, master);
//   LoadedModel m = ReadHfGpt2("gpt2.safetensors");    // m.config inferred, m.weights keel's
#pragma once

#include <string>

#include "keel/ckpt/model_file.h"
#include "keel/model/config.h"
#include "keel/model/params.h"

namespace keel::ckpt {

// Writes `master` (layout.total() floats, keel's layout for `cfg`) under HF GPT-2 names and
// shapes, with metadata {"format": "pt", "n_head": ...}, and config.json (GPT2LMHeadModel) beside
// it. Throws keel::Error on I/O failure.
void WriteHfGpt2(const std::string& path, const model::ModelConfig& cfg,
                 const model::ParamLayout& layout, const float* master);

// Reads an HF GPT-2 safetensors file (F32, F16 or BF16) into keel's layout; the padded wte rows
// are zero. `n_head` > 0 is used when the file does not say (and must agree when it does).
// Throws keel::Error (bad input), one line naming the file and the tensor, e.g.
//   a.safetensors: tensor "transformer.h.0.mlp.c_fc.weight": expected shape [64, 256], got
//   [256, 64]
LoadedModel ReadHfGpt2(const std::string& path, int n_head = 0);

// True if the file holds an HF GPT-2 model rather than a keel model file (keel's files say
// "format": "keel-model" in their metadata; HF's say "pt" or nothing).
bool IsHfGpt2File(const std::string& path);

// The config.json beside an exported safetensors file (HF's from_pretrained reads a folder).
std::string ConfigBeside(const std::string& safetensors_path);

// keel's name for a parameter → the HF GPT-2 name ("wte.weight" → "transformer.wte.weight").
std::string HfGpt2Name(const std::string& keel_name);

}  // namespace keel::ckpt

// Where a model's weights come from when they leave or enter keel outside a run: the source of
// `keel ckpt export`, and the `[model] init_from` file a run starts from instead of random
// weights.
//
//   LoadedModel m = LoadWeightsForExport("runs/x");              // runs/x/model.safetensors
//   LoadInitWeights("gpt2.safetensors", cfg, model.master());    // keel or HF GPT-2 file
#pragma once

#include <memory>
#include <string>

#include "keel/ckpt/model_file.h"
#include "keel/model/config.h"

namespace keel::ckpt {

// The weights `keel ckpt export SRC` converts: SRC is a checkpoint folder (step_N), a run or
// checkpoints folder (its newest checkpoint, else the run's model.safetensors), a Hugging Face
// Llama folder (hf_llama.h), or a keel model file. Throws keel::Error (bad input) naming SRC when
// it is none of these. With `adapters`, a LoRA run's adapters alone (ReadCheckpointAdapters; a
// model file or a folder without checkpoints gives its config, with no adapters).
LoadedModel LoadWeightsForExport(const std::string& src, bool adapters = false);

// The weights `keel generate` and `keel eval` run: SRC is a folder (as LoadWeightsForExport) or a
// model file (as ReadAnyModelFile).
LoadedModel LoadAnyModel(const std::string& src);

// Reads a keel model file or an HF GPT-2 safetensors file (told apart by the metadata's
// "format"); `n_head` is used for HF files that do not say (see ReadHfGpt2).
LoadedModel ReadAnyModelFile(const std::string& path, int n_head = 0);

// Fills `master` (ParamLayout::Whole(cfg).total() floats) from `path` (a keel model file, an HF
// GPT-2 file or an HF Llama folder), after
// checking that the file's shapes are `cfg`'s. Throws keel::Error (bad input), one line, e.g.
//   [model] init_from a.safetensors: n_layer is 12 in the file, 4 in the config
// `adapter` (may be empty): a PEFT LoRA folder merged into the file's weights first (peft.h). A
// LoRA `cfg` takes the file's weights for its base and keeps its adapters' initial values.
void LoadInitWeights(const std::string& path, const model::ModelConfig& cfg, float* master,
                     const std::string& adapter = "");

// `path` (a keel model file or an HF Llama folder) opened a tensor at a time for a LoRA `cfg`'s
// frozen base, its shapes checked against cfg's base as LoadInitWeights checks them; null for an
// HF GPT-2 file (its Conv1D matrices are transposed whole: LoadInitWeights reads it).
std::unique_ptr<TensorSource> OpenInitTensors(const std::string& path,
                                              const model::ModelConfig& cfg);

}  // namespace keel::ckpt

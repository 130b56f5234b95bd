// The model inside a checkpoint: its shapes (the manifest's state "model") and its fp32 master
// weights, for the tools that want the model alone (`keel ckpt export`, `keel generate` later).
//
//   LoadedModel m = ReadCheckpointModel("runs/x/checkpoints/step_00000020");
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "keel/ckpt/manifest.h"
#include "keel/ckpt/model_file.h"
#include "keel/ckpt/state.h"
#include "keel/model/config.h"
#include "keel/model/params.h"

namespace keel::ckpt {

// {"n_layer": .., "n_head": .., "n_embd": .., "vocab_size": .., "block_size": ..}
nlohmann::json ModelConfigToJson(const model::ModelConfig& c);
// Throws keel::Error (bad input) naming `where` and the key.
model::ModelConfig ModelConfigFromJson(const nlohmann::json& j, const std::string& where);

// The manifest against the model its state describes (state.model): every tensor of that model,
// for every kind the manifest holds (master, adam_m, adam_v), with its shape, and no other.
// Throws keel::Error (bad input) naming `dir` and the first difference. `keel ckpt verify` and
// resume both run it. A manifest without state.model (written by a tool, not a run) passes.
void CheckManifestModel(const Manifest& m, const std::string& dir);
// A run's model against the checkpoint's (state.model): throws bad input naming the first field
// that differs, with both values.
void CheckSameModel(const Manifest& m, const model::ModelConfig& run, const std::string& dir);

// A LoRA run's checkpoint: it holds the adapters (master weights and moments) and names its frozen
// base in state.base ({init_from, init_adapter, seed, precision}) instead of holding it.
bool HoldsAdaptersOnly(const Manifest& m);
// Fills `whole` (ParamLayout::Whole(cfg).total() floats) with that base as the run held it: its
// seed's init, [model] init_from's weights over it, rounded to bf16 where a bf16 run kept them
// so. The adapters keep their initial values. Throws keel::Error (bad input) naming `where`.
void RebuildLoraBase(const nlohmann::json& base, const model::ModelConfig& cfg, float* whole,
                     const std::string& where);

// The tensors of a parameter layout, as a checkpoint names them.
std::vector<TensorSpec> TensorSpecs(const model::ParamLayout& layout);

// Opens a committed checkpoint folder and reads its model config and master weights (every
// piece verified). Throws keel::Error (bad input) with one line.
// A LoRA run's checkpoint comes merged (model::MergeLora).
LoadedModel ReadCheckpointModel(const std::string& dir);
// A LoRA run's adapters alone (PEFT export): its config (adapters included) and the adapters'
// master weights packed as the LoRA layout's gradients are (ParamInfo::grad_offset), without the
// frozen base, which an 8B model would need 32 GB of fp32 for. Bad input for a checkpoint
// without adapters.
LoadedModel ReadCheckpointAdapters(const std::string& dir);

}  // namespace keel::ckpt

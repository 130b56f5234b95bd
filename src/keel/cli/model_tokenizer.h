// What `keel generate` and `keel eval` know of a model's source beyond its weights: the run it
// belongs to and the tokenizer it was trained with, so that text is encoded with that tokenizer
// and a dataset of another one is refused instead of scored.
//
//   auto run = RunConfigOf("runs/chat");                 // runs/chat/config.toml
//   auto known = TokenizerOfModel("runs/chat", run);     // its [data] train's meta.json says
//   data::Tokenizer tok = LoadModelTokenizer(flag, known, cfg, "generate");
#pragma once

#include <optional>
#include <string>

#include "keel/data/tokenizer.h"
#include "keel/model/config.h"
#include "keel/train/config.h"

namespace keel::cli {

// The run a source belongs to: a run folder's config.toml, a checkpoint's run (two levels up:
// RUN/checkpoints/step_N) or its model.safetensors's (the folder it is in). None for a file or
// folder outside a run.
std::optional<train::RunConfig> RunConfigOf(const std::string& source);

struct KnownTokenizer {
  std::string spec;           // for data::Tokenizer::Load ("gpt2", "llama3", a tokenizer.json)
  std::string from;           // where it was found, for messages
  int vocab_size = 0;         // its ids
  std::string chat_template;  // the template its chat data was prepared with; "" when none
};

// The tokenizer the model of `source` was trained with where the source says: a Hugging Face
// folder's tokenizer.json, or the meta.json of its run's (first) training dataset (GPT-2's for a
// flat token file). None for a bare model file, or a tokenizer.json keel does not read.
std::optional<KnownTokenizer> TokenizerOfModel(const std::string& source,
                                               const std::optional<train::RunConfig>& run);

// `flag` (--tokenizer: a name or a tokenizer.json) when given, else the known one, else GPT-2's.
// Throws keel::Error (bad input) naming both sizes when its ids do not fit the model's vocabulary,
// or, for GPT-2's taken by default, when the model's vocabulary is another size.
data::Tokenizer LoadModelTokenizer(const std::string& flag,
                                   const std::optional<KnownTokenizer>& known,
                                   const model::ModelConfig& cfg, const std::string& verb);

}  // namespace keel::cli

// The few continuations a run prints when it finishes: a quick look at what the model learned.
#pragma once

#include "keel/model/params.h"
#include "keel/train/config.h"

namespace keel::train {

// Tokenizes [train] sample_prompt with the GPT-2 tokenizer from $KEEL_ASSETS (or the build's asset
// folder) and prints [train] sample_count continuations of [train] sample_tokens tokens.
void PrintSamples(const RunConfig& cfg, const model::ModelConfig& mcfg,
                  const model::ParamLayout& layout, const float* weights);

// Where the GPT-2 tokenizer files are: $KEEL_ASSETS, else the source tree's assets/gpt2.
std::string TokenizerDir();
// The folder of gpt2/ and tokenizers/ (Tokenizer::Load's `assets`): $KEEL_ASSETS, else the source
// tree's assets.
std::string AssetsDir();

}  // namespace keel::train

// The few continuations a run prints when it finishes: a quick look at what the model learned.
#pragma once

#include "keel/model/params.h"
#include "keel/train/config.h"

namespace keel::train {

// Tokenizes [train] sample_prompt with the GPT-2 tokenizer (data::TokenizerDir) and prints [train]
// sample_count continuations of [train] sample_tokens tokens.
void PrintSamples(const RunConfig& cfg, const model::ModelConfig& mcfg,
                  const model::ParamLayout& layout, const float* weights);

}  // namespace keel::train

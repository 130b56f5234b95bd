// The few continuations a run prints when it finishes: a quick look at what the model learned.
#pragma once

#include "keel/data/dataset_meta.h"
#include "keel/model/params.h"
#include "keel/train/config.h"

namespace keel::train {

// Tokenizes [train] sample_prompt with the tokenizer of the training data (`meta`: its meta.json,
// null for a flat token file: GPT-2's) and prints [train] sample_count continuations of [train]
// sample_tokens tokens. A tokenizer that cannot be loaded or cannot decode what the model samples
// is one line: a finished run's last save and record come after the samples.
void PrintSamples(const RunConfig& cfg, const model::ModelConfig& mcfg,
                  const model::ParamLayout& layout, const float* weights,
                  const data::DatasetMeta* meta);

}  // namespace keel::train

// The run's training and validation data: opened, checked against the model's vocabulary and
// each other's tokenizer, with this data-parallel rank's loader and the validation windows.
//
//   RunData d = OpenData(cfg, mcfg, dp_rank, dp, micro_batch);   // throws keel::Error (bad input)
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "keel/data/dataset.h"
#include "keel/data/loader.h"
#include "keel/model/config.h"
#include "keel/train/config.h"
#include "keel/train/evaluation.h"

namespace keel::train {

// The run's data: the training sources (a blend, or one plain dataset) and the validation set,
// opened and checked against the model's vocabulary, with this data-parallel rank's loader.
struct RunData {
  std::vector<DataSource> sources;
  std::vector<data::TokenDataset> train_ds;
  std::vector<const data::TokenDataset*> train_ptrs;
  std::vector<double> weights;
  std::unique_ptr<data::TokenDataset> val_ds;
  std::unique_ptr<data::BatchLoader> loader;
  // The validation windows (evaluation.h): the same ones at every validation and in `keel eval`.
  std::optional<EvalPlan> val_plan;

  // Entropy of the training tokens' distribution (nats): the loss of the best model that ignores
  // context; a model that learned anything sits well below it. For a blend, that of the weighted
  // mixture of the sources' distributions, which is what the trainer samples from. Counts at most
  // the first 20M tokens of each source.
  double UnigramEntropy() const;
};

// Opens [data] train (or [[data.sources]]) and [data] val, checks their ids against the model's
// vocabulary and that they share one tokenizer, and builds this rank's loader (dp_rank of dp) and
// the validation plan (micro-batches of `micro_batch`).
RunData OpenData(const RunConfig& cfg, const model::ModelConfig& mcfg, int dp_rank, int dp,
                 int micro_batch);

}  // namespace keel::train

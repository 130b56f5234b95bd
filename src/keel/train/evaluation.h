// Loss over fixed windows of a token dataset: the number `keel eval` prints and the trainer's
// periodic validation reports, the same for any rank count.
//
// Window w is tokens [w·T, w·T + T]: its first T are the inputs, its last T the targets, so every
// token after the first is predicted exactly once and no window overlaps another's targets. A
// loss-masked dataset's windows are packed by document instead and count the targets its mask
// trains on (data::SampleWindows): the loss is the mean over those.
// Windows go in batches of B in order (batch j = windows [jB, jB + B), the last padded with rows
// whose targets count no loss); data-parallel rank d evaluates batches d, d + dp, ...; each
// batch's Σ losses goes into its slot of a vector that is summed over the ranks (one non-zero term
// per slot, so the sum is exact) and then added up in batch order. A batch is computed the same
// way wherever it runs, so the result is bitwise the same for 1 rank or 8.
//
//   EvalPlan plan = PlanEval(ds.size(), /*T=*/1024, /*B=*/4, /*max_windows=*/0);   // all of it
//   EvalResult r = Evaluate(ds, plan, world, dp_rank, dp, forward);  // r.loss, r.perplexity()
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "keel/data/dataset.h"
#include "keel/data/windows.h"
#include "keel/parallel/comm.h"

namespace keel::train {

struct EvalPlan {
  int T = 0, B = 0;
  size_t windows = 0, batches = 0;
  size_t tokens() const { return windows * size_t(T); }  // targets that count
};

// Windows of `dataset_tokens`: all of them, or the first `max_windows` (0: all). Throws keel::Error
// (bad input) when the dataset is shorter than one window.
EvalPlan PlanEval(size_t dataset_tokens, int T, int B, size_t max_windows, const std::string& what);
// The same for a dataset, whose windows a loss mask packs by document.
EvalPlan PlanEval(const data::TokenDataset& ds, int T, int B, size_t max_windows,
                  const std::string& what);

// Batch j of the plan: B·T inputs and targets; rows past the last window get targets -1. Returns
// the targets that count.
int64_t FillEvalBatch(data::SampleWindows& windows, const EvalPlan& plan, size_t j, int32_t* tokens,
                      int32_t* targets);

struct EvalResult {
  double loss = 0;  // mean over the targets that count, nats per token
  size_t tokens = 0, windows = 0;
  double seconds = 0;
  double perplexity() const { return std::exp(loss); }
};

// Σ losses of one batch on this rank: the model replica's result on exactly one of its ranks and 0
// on the others (a pipeline's last stage, tensor-parallel rank 0).
using BatchLoss = std::function<double(const int32_t* tokens, const int32_t* targets)>;

// Every rank of `world` calls it. Each data-parallel rank runs the same number of forward passes
// (ZeRO-3 gathers weights across them in each): a rank short of batches runs one with no targets.
// `progress`: a line on stderr for long passes (keel eval; the trainer's own line says it).
EvalResult Evaluate(const data::TokenDataset& ds, const EvalPlan& plan, parallel::Comm& world,
                    int dp_rank, int dp, const BatchLoss& forward, bool progress);

}  // namespace keel::train

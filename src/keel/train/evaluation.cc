#include "keel/train/evaluation.h"

#include <algorithm>
#include <string>
#include <vector>

#include "keel/core/error.h"
#include "keel/core/progress.h"
#include "keel/core/timer.h"

namespace keel::train {

EvalPlan PlanEval(size_t dataset_tokens, int T, int B, size_t max_windows,
                  const std::string& what) {
  KEEL_CHECK(T > 0 && B > 0, "PlanEval: T and B must be positive");
  EvalPlan p;
  p.T = T;
  p.B = B;
  p.windows = dataset_tokens > 0 ? (dataset_tokens - 1) / size_t(T) : 0;
  if (p.windows == 0)
    ThrowBadInput(what + ": " + std::to_string(dataset_tokens) +
                  " tokens, fewer than one evaluation window of " + std::to_string(T + 1));
  if (max_windows > 0) p.windows = std::min(p.windows, max_windows);
  p.batches = (p.windows + size_t(B) - 1) / size_t(B);
  return p;
}

EvalPlan PlanEval(const data::TokenDataset& ds, int T, int B, size_t max_windows,
                  const std::string& what) {
  if (!ds.masked()) return PlanEval(ds.size(), T, B, max_windows, what);
  EvalPlan p = PlanEval(size_t(T) + 1, T, B, max_windows, what);  // checks T and B
  data::SampleWindows windows(ds, T);
  p.windows = windows.count();
  if (max_windows > 0) p.windows = std::min(p.windows, max_windows);
  // Windows without a trained target would score loss 0, perplexity 1: a perfect model. Said at
  // the start (keel eval, or a run's setup), not at a run's first validation.
  size_t w = 0;
  while (w < p.windows && windows.Scored(w) == 0) ++w;
  if (w == p.windows)
    ThrowBadInput(what + ": no target the loss mask trains on in its first " +
                  std::to_string(p.windows) + " windows of " + std::to_string(T) +
                  " tokens (a conversation is cut at seq_len + 1 tokens: are its replies past " +
                  "that?)");
  p.batches = (p.windows + size_t(B) - 1) / size_t(B);
  return p;
}

int64_t FillEvalBatch(data::SampleWindows& windows, const EvalPlan& plan, size_t j, int32_t* tokens,
                      int32_t* targets) {
  const size_t T = size_t(plan.T);
  int64_t scored = 0;
  for (size_t r = 0; r < size_t(plan.B); ++r) {
    const size_t w = j * size_t(plan.B) + r;
    if (w >= plan.windows) {
      std::fill(tokens + r * T, tokens + (r + 1) * T, 0);
      std::fill(targets + r * T, targets + (r + 1) * T, -1);
      continue;
    }
    scored += windows.Read(w, tokens + r * T, targets + r * T);
  }
  return scored;
}

EvalResult Evaluate(const data::TokenDataset& ds, const EvalPlan& plan, parallel::Comm& world,
                    int dp_rank, int dp, const BatchLoss& forward, bool progress) {
  Timer timer;
  const size_t rounds = (plan.batches + size_t(dp) - 1) / size_t(dp);
  // Per batch: Σ losses, then (second half) the targets that count.
  std::vector<double> sums(2 * plan.batches, 0.0);
  std::vector<int32_t> tokens(size_t(plan.B) * plan.T), targets(tokens.size());
  data::SampleWindows windows(ds, plan.T);
  Progress bar("eval", double(plan.windows), "windows", progress && world.rank() == 0);
  for (size_t round = 0; round < rounds; ++round) {
    const size_t j = round * size_t(dp) + size_t(dp_rank);
    if (j < plan.batches) {
      sums[plan.batches + j] =
          double(FillEvalBatch(windows, plan, j, tokens.data(), targets.data()));
      sums[j] = forward(tokens.data(), targets.data());
    } else {
      std::fill(tokens.begin(), tokens.end(), 0);
      std::fill(targets.begin(), targets.end(), -1);
      (void)forward(tokens.data(), targets.data());
    }
    bar.Update(double(std::min(plan.windows, (round + 1) * size_t(dp) * size_t(plan.B))));
  }
  bar.Finish();
  world.AllReduceSum(sums.data(), sums.size());
  double total = 0, scored = 0;
  for (size_t j = 0; j < plan.batches; ++j) {
    total += sums[j];
    scored += sums[plan.batches + j];
  }
  // Every rank of a replica (its pipeline stages and tensor-parallel ranks) filled the batch and
  // counted its targets; its loss is counted once (BatchLoss).
  scored /= double(std::max(1, world.size() / dp));
  EvalResult r;
  r.tokens = size_t(scored);
  r.windows = plan.windows;
  r.loss = total / scored;
  r.seconds = timer.Seconds();
  return r;
}

}  // namespace keel::train

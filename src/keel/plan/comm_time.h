// Communication volume per step per kind (tp, pp, dp) and the step time built from compute,
// communication and the pipeline bubble; FLOPs per PaLM (Chowdhery et al. 2022, Appendix B).
#pragma once

#include "keel/parallel/pipeline_schedule.h"
#include "keel/plan/job.h"

namespace keel::plan {

struct CommVolume {
  // Bytes each rank sends per optimizer step (ring algorithms: bus bytes), and the seconds they
  // take at the bandwidth of the link the group spans.
  double tp_bytes = 0, pp_bytes = 0, dp_bytes = 0;
  double tp_s = 0, pp_s = 0, dp_s = 0;
  bool tp_intra = true, pp_intra = true, dp_intra = true;  // inside one node?
  // Context parallelism: the keys and values (and their gradients) of every layer's attention,
  // bytes as the trainer counts them (model/context_parallel.h); EstimateTime counts what the
  // ring's blocks do not cover (and all of the all-gather's).
  double cp_bytes = 0, cp_s = 0;
  bool cp_intra = true;
};

CommVolume EstimateComm(const Job& job, const Layout& l);

// Model FLOPs per token: 6N + 12·L·h·s, less 2 per frozen matrix weight under LoRA (PaLM's MFU:
// the attention scores count, the recomputation does not).
double ModelFlopsPerToken(const ModelSpec& m, double n_params);
// What the hardware executes per token: the model FLOPs plus the recomputed forward (full:
// 2N + 4Lhs more; selective: the attention core again, 4Lhs).
double HardwareFlopsPerToken(const ModelSpec& m, double n_params, Recompute rc);

// (pp - 1) / (m + pp - 1): the idle share of a 1F1B pipeline with m micro-batches (the
// trainer's schedules and this formula live in parallel/pipeline_schedule.h).
using parallel::PipelineBubble;

// The busiest pipeline stage's work over the average stage's, with equal stages of blocks and the
// classifier on the last (GPT-2 124M at pp 2: 1.30; 175B at pp 8: 1.03). 1 without a pipeline.
double PipelineStageImbalance(const ModelSpec& m, int pp);

struct StepTime {
  int micro_batches = 0;
  double bubble = 0;
  double compute_s = 0;  // matrix products at job.efficiency of peak, no bubble
  double exposed_comm_s = 0;
  double offload_s = 0;  // [offload]: the tier's reads and writes in the update, which waits
  double step_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;
};

// `tier_traffic`: each rank's bytes over an offload tier's link per step
// (MemoryBreakdown::tier_traffic), which the update waits for: a disk's bandwidth the node's ranks
// share, the host tier's each rank's own.
StepTime EstimateTime(const Job& job, const Layout& l, const CommVolume& c,
                      double tier_traffic = 0);

}  // namespace keel::plan

// Memory per accelerator: model state (weights, grads, fp32 master, AdamW moments) sharded by
// ZeRO stage, activations per Korthikanti et al. 2022 ("Reducing Activation Recomputation in
// Large Transformer Models", Table 2), communication buffers and headroom.
//
//   auto bpp = keel::plan::StateBytesPerParam(Precision::kBf16, Accounting::kPaper);  // 16
//   auto st = keel::plan::ModelStateBytes(7.5e9, bpp, /*zero=*/3, /*dp=*/64);  // 1.875e9 total
#pragma once

#include "keel/parallel/state_bytes.h"
#include "keel/plan/job.h"

namespace keel::plan {

struct BytesPerParam {
  double weights = 0, grads = 0, master = 0, moments = 0;
  double total() const { return weights + grads + master + moments; }
};

// bf16/paper: 2+2+4+8 = 16. bf16/keel: 2+4+4+8 = 18 (fp32 grads). fp32: 4+4+0+8 = 16 (the
// working weights are the master weights). bf16 moments: 4 fewer; no master: 4 fewer; bf16
// gradients (keel accounting): 2 fewer.
BytesPerParam StateBytesPerParam(Precision p, Accounting a, bool bf16_moments = false,
                                 bool master = true, bool bf16_grads = false);
BytesPerParam StateBytesPerParam(const Job& j);

struct StateMemory {
  double params = 0, grads = 0, master = 0, moments = 0;
  double offload =
      0;  // [offload]: the tier's chunk buffers (what was master and moments is on disk)
  double total() const { return params + grads + master + moments + offload; }
};

// ZeRO (Rajbhandari et al. 2020): stage 1 shards master + moments over dp, stage 2 also the
// grads, stage 3 also the weights. psi: parameters held by this model-parallel rank.
StateMemory ModelStateBytes(double psi, const BytesPerParam& bpp, int zero, int dp);

// Activation bytes of one transformer layer for one micro-batch (s: sequence, b: micro-batch,
// h: hidden, a: heads, t: tensor-parallel size), 16-bit activations, per Korthikanti Table 2.
double LayerActivationBytes(double s, double b, double h, double a, int t, bool sp, Recompute rc);
// Which row of Korthikanti's Table 2 LayerActivationBytes used, e.g. "tp+sp+selective: sbh(34/t)".
const char* ActivationRow(int t, bool sp, Recompute rc);

// Parameters held by the busiest model-parallel rank (the first or last pipeline stage).
double ParamsPerRank(const ModelSpec& m, int tp, int pp);
// All parameters, exactly as keel allocates them (model::ParamLayout::Gpt2: padded vocabulary,
// position embedding, biases, LayerNorms).
double TotalParams(const ModelSpec& m);
// LoRA: the adapters' parameters (all of them otherwise), and the frozen base's matrix-product
// weights, whose weight gradients are not computed (0 otherwise).
double TrainableParams(const ModelSpec& m);
double FrozenMatmulParams(const ModelSpec& m);
// LoRA: the adapter factors every tp rank holds whole (a column-parallel product's A, a
// row-parallel one's B), whose gradients the tp group sums; tensor parallelism cuts the rest.
double TrainableWholeUnderTp(const ModelSpec& m);

struct MemoryBreakdown {
  StateMemory state;
  double activations = 0;
  double comm_buffers = 0;
  double headroom = 0;  // kept free: allocator fragmentation, runtime context, workspaces
  double capacity = 0;
  double tier = 0;  // [offload]: bytes on the tier's disk, or in host memory (not in used())
  // The bytes the tier's link carries per rank per step: a disk's reads and writes of the state
  // (the node's ranks share it), or the host tier's gradient and weight copies (each rank's own
  // PCIe link).
  double tier_traffic = 0;
  bool exact_activations = false;  // from keel's own arena (model::PlanActivations)
  double used() const { return state.total() + activations + comm_buffers; }
  bool fits() const { return used() + headroom <= capacity; }
};

// The busiest rank's memory. With keel's accounting and tp = 1, the trainer's own buffers to the
// byte (KeelStageMemory of every pipeline stage; the largest).
MemoryBreakdown EstimateMemory(const Job& job, const Layout& l);

// What one rank of pipeline stage `stage` allocates in keel: the parameter store and ZeRO buffers
// (parallel::StateBytesPerRank over the stage's layout) and the models' activation arenas
// (model::PlanActivations for each of its chunks' blocks and slots under the schedule). tp must
// be 1.
MemoryBreakdown KeelStageMemory(const Job& job, const Layout& l, int stage);

// The job's state dtypes, master and offload tier, as `keel train` would set them from a config.
parallel::StateTiers TiersOf(const Job& job);

}  // namespace keel::plan

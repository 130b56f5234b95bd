// The one training step: zero the gradients, forward and backward over the micro-batches, the
// gradient strategy (data parallel, ZeRO 1/2/3), frozen parameters, the global norm, clipping
// and the update. The trainer, `keel preflight` and the benchmarks all run this; none has a copy.
//
//   TrainStep st(spec, dp_comm);                   // or (spec, groups.ForStep()): groups.h
//   st.SetWeights(full_fp32_master);
//   double loss = st.ForwardBackward(n_micro, next_batch, 1.0f / tokens_per_step);
//   double norm = st.Update(lr, /*clip=*/1.0f, before_update);
//
// Under pipeline parallelism (groups.pp) this rank is one stage: it holds blocks [l0, l1) of the
// model (ParamLayout::Stage), the micro-batches run through the 1F1B schedule (Pipeline),
// the tied embedding's gradient is summed between the first and last stage (groups.tied), and
// the gradient norm and the loss are summed over the stages. Under tensor parallelism (groups.tp)
// the rank holds its shard of every tensor it holds (ParamLayout's TpShard), the model's layers
// talk over the tp group, and the norm sums the shards (tensors every tp rank holds whole count
// once: they are replicas on all but tp rank 0).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "keel/ckpt/state.h"
#include "keel/kernels/backend.h"
#include "keel/model/transformer.h"
#include "keel/optim/param_store.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/groups.h"
#include "keel/parallel/layout.h"
#include "keel/parallel/state_bytes.h"
#include "keel/train/diloco.h"
#include "keel/train/pipeline.h"
#include "keel/train/zero.h"

namespace keel::train {

struct StepSpec {
  model::ModelConfig model;
  DType dtype = DType::kBF16;
  int seq_len = 64;
  model::Recompute recompute = model::Recompute::kNone;
  // dp, tp, pp, zero; sequence parallelism, virtual and uneven stages; micro_batch and n_micro
  // (which sizes the pipeline's slots).
  parallel::Layout layout;
  optim::AdamWHyper hyper;
  std::vector<bool> frozen;  // per parameter of the layout; empty: none
  size_t bucket_elems = size_t(25) << 18;
  double comm_timeout_s = 600;
  kernels::Device device = kernels::Device::kCpu;  // where the state lives and the kernels run
  // Document masking (model::Transformer::SetDocumentMask) at this end-of-document token: set for
  // loss-masked data, whose rows pack whole conversations. -1: off.
  int document_eos = -1;
  uint64_t seed = 0;  // the run's ([train] seed): LoRA dropout's masks derive from it
  // The state's dtypes, master and tier (TiersOf(RunConfig)): tiers.master false (bf16 runs): no
  // fp32 master, the bf16 weights updated with stochastic rounding; tiers.offload_chunk: the
  // moments (and a bf16 run's master; with offload_params at ZeRO 3, the weights' shard) on a disk
  // tier in offload_dir, or with offload_host in pinned host memory (a GPU's).
  parallel::StateTiers tiers;
  std::string offload_dir;
  DilocoSpec diloco;  // inner_steps > 0: [parallel] dp_sync = "diloco" (diloco.h)
};

// The groups a step talks to: parallel::Groups::ForStep(), or any comms of the right sizes.
using parallel::StepGroups;

class TrainStep {
 public:
  // `dp_comm`: the data-parallel group (every rank of it runs the same steps).
  TrainStep(const StepSpec& spec, parallel::Comm& dp_comm);
  TrainStep(const StepSpec& spec, const StepGroups& groups);
  ~TrainStep();

  const kernels::Backend& backend() const { return be_; }

  const model::ParamLayout& layout() const { return layout_; }
  model::Transformer& model() { return *models_.front(); }  // the first chunk
  optim::ParamStore& store() { return *store_; }
  ZeroStrategy& strategy() { return *zero_; }

  // The fp32 master weights from the whole layout's values (every rank passes the same); each
  // rank keeps what it holds, and the working weights follow.
  void SetWeights(const float* full);
  // A tensor's fp32 values (p: this rank's layout's, not a tensor-parallel shard), in `scratch`
  // or elsewhere.
  using TensorValues =
      std::function<const float*(const model::ParamInfo& p, std::vector<float>& scratch)>;
  // A compact state's (LoRA's) weights a tensor at a time: the frozen base is never whole in
  // fp32 (a 3B base's copy would be 12 GB), each tensor going straight to its working form.
  void SetWeights(const TensorValues& values);
  // After a checkpoint filled the store's master and moments: the working weights follow.
  // `own_missing`: the names of StateView().own the checkpoint did not have (DiLoCo: a replica
  // without its own master starts from the anchor). `saved_replicas`: the data-parallel width
  // that saved it (0: this run's), which DiLoCo's start line compares with its own.
  void Restored(int optimizer_step, int step_done, const std::vector<std::string>& own_missing = {},
                int saved_replicas = 0);
  // Before a checkpoint copies StateView's buffers: streaming DiLoCo's fragments in flight
  // arrive, and the fp8 trackers' state is written where StateView().own points.
  void BeforeSave();
  // DiLoCo's outer loop; null unless [parallel] dp_sync = "diloco".
  OuterLoop* diloco() { return outer_.get(); }
  // The whole model's fp32 master weights (ParamLayout::Gpt2), on every rank.
  std::vector<float> GatherWeights();

  // Forward and backward over `n_micro` micro-batches; the sum of the row losses over the whole
  // data-parallel group (every stage gets it). `data_ms` (optional) receives the time spent
  // waiting for batches.
  // The step the next ForwardBackward computes (its LoRA dropout masks derive from it, so that a
  // re-run of the step, a resume and any layout draw the same). 0 until set.
  void SetStepIndex(int64_t step) { step_index_ = step; }
  double ForwardBackward(int n_micro, const NextBatch& next, float dloss,
                         double* data_ms = nullptr);
  // Norm, clipping, AdamW; `before_update` runs just before the state changes (a checkpoint's
  // snapshot must be done). Returns the global gradient norm before clipping.
  double Update(float lr, float grad_clip, const std::function<void()>& before_update = nullptr);
  // Update in two halves, for a caller that judges the step between them (the trainer's
  // detectors): the global norm (every rank of the step gets the same), then clipping and AdamW.
  // Under DiLoCo it is the replica's own gradient's norm (the one it clips by); JudgedNorm gives
  // every rank the same figure for the detectors.
  double GradNorm();
  double JudgedNorm(double norm);
  // `unscale`: 1 / the loss scale the gradients carry (`norm` is already the unscaled one).
  void Apply(float lr, float grad_clip, double norm, double unscale = 1.0);
  // Σ row losses of one micro-batch, forward only, this rank's (through the pipeline: the last
  // stage returns it, the others 0; of a tensor-parallel group, tp rank 0), so that the sum over
  // the world counts each once. Under context parallelism, of this rank's chunks of the batch's
  // whole sequences (the cp ranks' add up).
  double Forward(const int32_t* tokens, const int32_t* targets);

  // fp8 runs (ModelConfig::fp8): the step's amax of every fp8 tensor reduced (max) over the
  // data-parallel and tensor-parallel groups, so that the ranks judge alike, and judged; one line
  // per block that falls back to bf16 from the next step on (this stage's). fp8_blocks: the blocks
  // still in fp8, over every stage.
  std::vector<std::string> Fp8EndStep();
  int fp8_blocks();

  // The checkpointed state of this rank: master weights and AdamW moments over what it holds.
  ckpt::StateView StateView();
  // What this rank allocated, by kind (the figures `keel plan --accounting keel` predicts).
  nlohmann::json MemoryBytes() const;
  size_t ActivationBytes() const;  // every chunk's arena
  // Of the last step, by group: milliseconds waited on communication the step could not overlap
  // (dp: gradient reduction and ZeRO; tp: the layers' all-reduces, none overlapped; pp: activations
  // and gradients between stages, i.e. the bubble; tied: the embedding's gradient sum) and bytes
  // sent.
  double comm_wait_ms() const { return zero_->wait_ms() + tied_ms_ + tp_wait_ms() + cp_wait_ms(); }
  double comm_bytes() const {
    return zero_->sent_bytes() + pipe_->sent_bytes() + tied_bytes_ + tp_bytes() + cp_bytes();
  }
  double grad_comm_bytes() const { return zero_->grad_sent_bytes(); }  // dp's gradient sums
  double dp_wait_ms() const { return zero_->wait_ms(); }
  double pp_wait_ms() const { return pipe_->wait_ms(); }
  // Of the last ForwardBackward: the forward passes' compute, waits excluded.
  double forward_ms() const { return pipe_->forward_ms(); }
  double tp_wait_ms() const;
  // The fused classifier and loss (a part of the backward pass), in the last micro-batch step.
  double head_ms() const;
  double tp_bytes() const;
  // The context-parallel group's key and value collectives (the all-gather variant's waits are
  // all exposed) and their bytes.
  double cp_wait_ms() const;
  double cp_bytes() const;
  double tied_wait_ms() const { return tied_ms_; }
  // The fraction of this stage's schedule spent waiting for other stages (the measured bubble).
  double bubble() const { return pipe_->bubble(); }
  bool last_stage() const { return layout_.holds_last(); }

 private:
  // Context parallelism: this rank's chunks (parallel/zigzag.h) of a micro-batch's sequences.
  void KeepMine(const int32_t* tokens, const int32_t* targets, int32_t* my_tokens,
                int32_t* my_targets) const;
  void SumTiedGrads();
  void SumTpPartialGrads();
  // Sums `ranges` ([at, n) of the store's gradients) over `c`, all at once for fp32 gradients;
  // bf16 ones widen into sum_scratch_ and go in rounds of what it holds. Milliseconds waited.
  double SumGradRanges(parallel::Comm& c, const std::vector<std::pair<size_t, size_t>>& ranges,
                       const char* what);

  StepSpec spec_;
  const kernels::Backend& be_;
  StepGroups g_;
  parallel::Comm& comm_;
  model::ParamLayout layout_;
  std::unique_ptr<optim::ParamStore> store_;
  std::unique_ptr<ZeroStrategy> zero_;
  std::unique_ptr<OuterLoop> outer_;
  // fp8's trackers and fallbacks, every model's in turn (an own checkpoint tensor; BeforeSave).
  std::vector<float> fp8_saved_;
  std::string Fp8OwnName() const;  // "fp8.trackers.n<floats>" by OwnName
  // The name of this rank's own checkpoint tensor `what` (StateView::own): by its place in the
  // layout, so that a resume under the same layout finds its own. `dp_part` replaces the
  // data-parallel "<rank>of<size>" (a stand-in's pattern: "0of*").
  std::string OwnName(const std::string& what, const std::string& dp_part = "") const;
  std::vector<std::unique_ptr<model::Transformer>> models_;  // one per chunk
  std::unique_ptr<Pipeline> pipe_;
  Buffer sum_scratch_;  // parallel::GradSumScratchElems fp32 elements
  double tied_ms_ = 0, tied_bytes_ = 0, tp_sum_ms_ = 0, tp_sum_bytes_ = 0;
  int64_t step_index_ = 0;
  std::vector<int32_t> whole_tokens_, whole_targets_;  // a micro-batch's sequences, under cp
};

}  // namespace keel::train

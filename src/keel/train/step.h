// The one training step: zero the gradients, forward and backward over the micro-batches, the
// gradient strategy (data parallel, ZeRO 1/2/3), frozen parameters, the global norm, clipping
// and the update. The trainer, `keel preflight` and the benchmarks all run this; none has a copy.
//
//   TrainStep st(spec, dp_comm);
//   st.SetWeights(full_fp32_master);
//   double loss = st.ForwardBackward(n_micro, next_batch, 1.0f / tokens_per_step);
//   double norm = st.Update(lr, /*clip=*/1.0f, before_update);
//
// A tensor- or pipeline-parallel strategy plugs in beside ZeroStrategy: it implements
// model::ParamAccess over its own shards (a layer knows its tp slice; a stage holds blocks
// [l0, l1)), and this class keeps the loop over micro-batches, the norm and the update.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "keel/ckpt/state.h"
#include "keel/model/gpt.h"
#include "keel/optim/param_store.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/dims.h"
#include "keel/train/zero.h"

namespace keel::train {

struct StepSpec {
  model::ModelConfig model;
  DType dtype = DType::kBF16;
  int micro_batch = 1, seq_len = 64;
  model::Recompute recompute = model::Recompute::kNone;
  parallel::ParallelDims dims;
  optim::AdamWHyper hyper;
  std::vector<bool> frozen;  // per parameter of the layout; empty: none
  size_t bucket_elems = size_t(25) << 18;
  double comm_timeout_s = 600;
};

// Fills (micro_batch, seq_len) tokens and targets; returns the milliseconds it waited.
using NextBatch = std::function<double(int32_t* tokens, int32_t* targets)>;

class TrainStep {
 public:
  // `dp_comm`: the data-parallel group (every rank of it runs the same steps).
  TrainStep(const StepSpec& spec, parallel::Comm& dp_comm);
  ~TrainStep();

  const model::ParamLayout& layout() const { return layout_; }
  model::GptModel& model() { return *model_; }
  optim::ParamStore& store() { return *store_; }
  ZeroStrategy& strategy() { return *zero_; }

  // The fp32 master weights from the whole layout's values (every rank passes the same); each
  // rank keeps what it holds, and the working weights follow.
  void SetWeights(const float* full);
  // After a checkpoint filled the store's master and moments: the working weights follow.
  void Restored(int optimizer_step);
  std::vector<float> GatherWeights() { return zero_->GatherMaster(); }

  // Forward and backward over `n_micro` micro-batches; the sum of the row losses over the whole
  // data-parallel group. `data_ms` (optional) receives the time spent waiting for batches.
  double ForwardBackward(int n_micro, const NextBatch& next, float dloss,
                         double* data_ms = nullptr);
  // Norm, clipping, AdamW; `before_update` runs just before the state changes (a checkpoint's
  // snapshot must be done). Returns the global gradient norm before clipping.
  double Update(float lr, float grad_clip, const std::function<void()>& before_update = nullptr);
  // Σ row losses of one micro-batch, forward only, this rank's.
  double Forward(const int32_t* tokens, const int32_t* targets);

  // The checkpointed state of this rank: master weights and AdamW moments over what it holds.
  ckpt::StateView StateView();
  // What this rank allocated, by kind (the figures `keel plan --accounting keel` predicts).
  nlohmann::json MemoryBytes() const;
  double comm_wait_ms() const { return zero_->wait_ms(); }
  double comm_bytes() const { return zero_->sent_bytes(); }

 private:
  StepSpec spec_;
  parallel::Comm& comm_;
  model::ParamLayout layout_;
  std::unique_ptr<optim::ParamStore> store_;
  std::unique_ptr<ZeroStrategy> zero_;
  std::unique_ptr<model::GptModel> model_;
  std::vector<int32_t> tokens_, targets_;
};

}  // namespace keel::train

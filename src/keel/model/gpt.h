// A GPT-2 model for training: flat parameter, gradient and master buffers (ParamLayout), one
// activation arena (PlanActivations), and forward/backward built from keel's kernels.
//
// Precision: in fp32 the working weights are the master weights. In bf16 the working weights are
// a bf16 copy of the fp32 master (SyncWorking after every optimizer step); biases are read from
// the fp32 master, since they are added in fp32 inside the matrix products.
// Gradients are always fp32 and accumulate across micro-batches until ZeroGrads.
//
//   GptModel m(cfg, DType::kBF16, /*B=*/4, /*T=*/256, Recompute::kNone);
//   InitParams(m.layout(), cfg, seed, m.master()); m.SyncWorking();
//   m.ZeroGrads();
//   double loss = m.ForwardBackward(tokens, targets, 1.0f / (B * T), on_grads_ready);
#pragma once

#include <memory>

#include "keel/core/dtype.h"
#include "keel/model/activations.h"
#include "keel/model/config.h"
#include "keel/model/param_access.h"
#include "keel/model/params.h"

namespace keel::model {

class DenseParams;

class GptModel {
 public:
  // `params`: where the weights and gradients live (the trainer's ZeRO strategy). Null: the
  // model owns them, every segment resident (master(), grads(), working_bf16() below).
  GptModel(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
           ParamAccess* params = nullptr);
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const ModelConfig& config() const;
  const ParamLayout& layout() const;
  const ActivationPlan& activation_plan() const;
  DType dtype() const;
  int batch() const;
  int seq_len() const;

  // A model that owns its parameters only (throws otherwise):
  float* master();       // fp32 master weights, layout().total() floats
  float* grads();        // fp32 gradients, same layout
  bf16* working_bf16();  // the bf16 working copy; null in fp32 runs
  void ZeroGrads();
  void SyncWorking();  // working ← master (no-op in fp32)

  // tokens, targets: (B,T) int32. Adds dloss·∂(Σ row losses)/∂θ into the gradients; returns
  // Σ losses.
  double ForwardBackward(const int32_t* tokens, const int32_t* targets, float dloss);
  // Σ losses of the rows, forward only.
  double Forward(const int32_t* tokens, const int32_t* targets);
  // logits (B·T, vocab_size) fp32 of a forward pass, for tests and evaluation.
  void ForwardLogits(const int32_t* tokens, float* logits);

  struct Impl;

 private:
  DenseParams& Dense() const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::model

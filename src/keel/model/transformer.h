// A GPT-2 or Llama model (config.h's family) for training: flat parameter, gradient and master
// buffers (ParamLayout), one activation arena (PlanActivations), and forward/backward built from
// keel's kernels, as stage pieces that the step, pipeline stages and evaluation compose.
//
// Precision: in fp32 the working weights are the master weights. In bf16 the working weights are
// a bf16 copy of the fp32 master (SyncWorking after every optimizer step); GPT-2's biases are read
// from the fp32 master, since they are added in fp32 inside the matrix products.
// Gradients are always fp32 and accumulate across micro-batches until ZeroGrads.
//
//   Transformer m(cfg, DType::kBF16, /*B=*/4, /*T=*/256, Recompute::kNone);
//   InitParams(m.layout(), cfg, seed, m.master()); m.SyncWorking();
//   m.ZeroGrads();
//   double loss = m.ForwardBackward(tokens, targets, 1.0f / (B * T));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/kernels/backend.h"
#include "keel/model/activations.h"
#include "keel/model/config.h"
#include "keel/model/context_parallel.h"
#include "keel/model/param_access.h"
#include "keel/model/params.h"
#include "keel/parallel/comm.h"

namespace keel::model {

class DenseParams;

// The groups a model's layers talk to.
// `tp`: the tensor-parallel group its shards compute with (the layout's TpShard says which shard
// this rank holds): one all-reduce after each row-parallel projection in forward and one after
// each column-parallel product in backward (Megatron-LM's f and g), an all-reduce of the
// vocabulary-parallel embedding, and an all-gather of per-row statistics in the vocabulary-
// parallel cross-entropy. Waits past `timeout_s` exit 75 (parallel::WaitOrLost).
// `sequence` (Korthikanti et al. 2022): each rank holds 1/tp of the rows (B·T) of the residual
// stream and runs the LayerNorms on those; an all-gather before each column-parallel product and
// a reduce-scatter after each row-parallel one replace the all-reduces (and the reverse in
// backward). The LayerNorms' gradients then cover this rank's rows: the caller sums them over the
// group (NormParam).
// `cp` (context parallelism, context_parallel.h): the model's T rows per sequence are this rank's
// two chunks of a cp·T-token sequence (parallel/zigzag.h); the positions (GPT-2's learned ones,
// Llama's rotary ones) are those chunks', and attention gathers the other ranks' keys and values.
struct LayerGroups {
  parallel::Comm* tp = nullptr;  // null: no tensor parallelism
  double timeout_s = 600;
  bool sequence = false;
  parallel::Comm* cp = nullptr;  // null or one rank: whole sequences
  CpComm cp_comm = CpComm::kRing;
};

class Transformer {
 public:
  // `params`: where the weights and gradients live (the trainer's ZeRO strategy). Null: the
  // model owns them, every segment resident (master(), grads(), working_bf16() below).
  // `be`: where its buffers live and its kernels run; tokens and targets stay host memory.
  Transformer(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
              ParamAccess* params = nullptr, const kernels::Backend& be = kernels::Cpu());
  // One pipeline stage: blocks [stage.l0, stage.l1) with `params` laid out as
  // ParamLayout::Stage(cfg, stage), keeping the activations of `slots` micro-batches at once.
  Transformer(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
              ParamAccess* params, const StageRange& stage, int slots,
              const kernels::Backend& be = kernels::Cpu());
  // One chunk of an interleaved pipeline rank: blocks [chunk.l0, chunk.l1), with `params` laid
  // out as `layout` (the rank's: ParamLayout::Stage over all its chunks, its tp shard).
  Transformer(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
              ParamAccess* params, const ParamLayout& layout, const StageRange& chunk, int slots,
              const LayerGroups& groups = {}, const kernels::Backend& be = kernels::Cpu());
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const;
  const ParamLayout& layout() const;
  const ActivationPlan& activation_plan() const;
  DType dtype() const;
  const kernels::Backend& backend() const;
  int batch() const;
  int seq_len() const;
  int slots() const;  // micro-batches whose activations it keeps at once

  // A model that owns its parameters only (throws otherwise), in the backend's memory:
  float* master();  // fp32 master weights, layout().total() floats
  float* grads();   // fp32 gradients, same layout
  // The bf16 working copy (ParamLayout::work_offset: a quantized base's matrices are not in it);
  // null in fp32 runs.
  bf16* working_bf16();
  void ZeroGrads();
  void SyncWorking();  // working ← master (no-op in fp32)

  // Document masking for rows that pack several documents (loss-masked chat data): from here on a
  // position attends only to its own document, which ends with `eos_id` (-1: off, the default:
  // plain causal attention across the whole row).
  void SetDocumentMask(int eos_id);
  // Parameters that are not trained (by ParamInfo::stream, the whole layout's index): their matrix
  // products' weight gradients are skipped (LoRA's frozen base: a third of the step's FLOPs).
  void SetFrozen(const std::vector<bool>& frozen);
  // LoRA dropout (ModelConfig::lora_dropout) for the micro-batch in `slot`, until ClearDropout:
  // its mask's key (the run's seed and step) and `row0`, the index of its first row (token) among
  // the step's global batch, whose mask then depends on no layout. Training passes set it before
  // StageForward; without it (evaluation, Forward, ForwardLogits) no dropout is applied.
  void SetDropout(int slot, uint64_t key, uint64_t row0);
  void ClearDropout();

  // fp8 block products (ModelConfig::fp8): the step's amax of each of the stage's fp8 tensors, in
  // a fixed order, for the ranks that share them to reduce (max); then the step judged with the
  // reduced values, one line per block that falls back to bf16 from the next step on (a
  // non-finite amax, a spike: Fp8Tracker). fp8_blocks: the stage's blocks still in fp8.
  std::vector<float> Fp8StepAmax() const;
  std::vector<std::string> Fp8EndStep(const std::vector<float>& amax);
  int fp8_blocks() const;
  // The trackers' histories and the blocks' fallbacks as Fp8StateFloats floats (0 without fp8),
  // for a checkpoint; Fp8LoadState puts back what Fp8SaveState wrote.
  size_t Fp8StateFloats() const;
  void Fp8SaveState(float* out) const;
  void Fp8LoadState(const float* in);
  // Whether the passes from here on are training's, whose amaxes the step judges (true, the
  // default), or validation's, which use the scales without moving them.
  void SetFp8Observe(bool on);

  // tokens, targets: (B,T) int32. Adds dloss·∂(Σ row losses)/∂θ into the gradients; returns
  // Σ losses.
  double ForwardBackward(const int32_t* tokens, const int32_t* targets, float dloss);
  // Σ losses of the rows, forward only.
  double Forward(const int32_t* tokens, const int32_t* targets);
  // logits (B·T, vocab_size) fp32 of a forward pass, for tests and evaluation.
  void ForwardLogits(const int32_t* tokens, float* logits);

  // The stage pieces that ForwardBackward and Forward are made of, and that a pipeline schedule
  // calls with micro-batches in flight (`slot` < slots: whose activations). Between stages the
  // model's dtype travels: boundary_elems() elements, (B, T, C) (sequence parallelism: this
  // rank's B·T/tp rows).
  size_t boundary_elems() const;
  // The first block's input: a later stage receives its predecessor's output here before
  // StageForward. The last block's output: sent on to the next stage after StageForward.
  void* StageInput(int slot);
  const void* StageOutput(int slot);
  // Per slot: where the next stage's ∂loss/∂output is received (not the last stage), and where
  // StageBackward's ∂loss/∂input goes out from (not the first).
  void* PipeGradIn(int slot);
  void* PipeGradOut(int slot);
  // Embedding (first stage), the stage's blocks, the final LayerNorm (last stage).
  void StageForward(int slot, const int32_t* tokens);
  // Backward of the micro-batch in `slot`. The last stage starts from the loss (classifier
  // forward and backward, scaled by dloss; returns Σ row losses); the others from `dout`,
  // ∂loss/∂output received from the next stage (returns 0). A stage other than the first leaves
  // ∂loss/∂input in `din` for the previous stage.
  double StageBackward(int slot, const int32_t* tokens, const int32_t* targets, float dloss,
                       const void* dout, void* din);
  // Forward-only head of the last stage after StageForward: Σ row losses.
  double StageLoss(const int32_t* targets);

  // Since the last ResetStepStats: milliseconds waited on the tensor-parallel group's collectives
  // (none of them overlaps compute) and bytes sent into them; milliseconds in the fused
  // classifier and loss of StageBackward (the last stage's head), those waits excluded.
  double tp_wait_ms() const;
  double tp_bytes() const;
  // The same for the context-parallel group's key and value collectives.
  double cp_wait_ms() const;
  double cp_bytes() const;
  double head_ms() const;
  void ResetStepStats();

  struct Impl;

 private:
  DenseParams& Dense() const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::model

// The gradient strategy of a data-parallel group, ZeRO stages 0-3, as the model's ParamAccess:
// where each segment's weights come from before the model uses them, where its gradients go
// when backward finishes them, and how the update is published.
//
//   stage 0  gradients all-reduced in buckets during the last micro-batch's backward (GradSync)
//   stage 1  the same; each rank updates its shard of master and moments, then the working
//            weights are all-gathered
//   stage 2  each segment's gradients reduce-scattered as soon as backward finishes them, every
//            micro-batch, into this rank's gradient shard; the rest as stage 1
//   stage 3  as stage 2, and weights sharded too: a block's weights are all-gathered before its
//            forward and again before its backward, the next block's gather issued while the
//            current one computes; the embeddings and final LayerNorm stay gathered for the step
//
// A compact state (LoRA) runs stages 0, 1 and 3: its adapters' gradients are all-reduced whole
// (a few MB) and their master and moments sharded from stage 1 on; at stage 3 the frozen base
// (with a quantized base's codes and scales, and the adapters' working weights) is sharded too,
// as the segments' packs (model/segment_pack.h), and gathered a segment at a time as above.
//
// bf16 gradients (optim.grad_dtype): backward writes each segment into an fp32 slot, as at stage 2,
// which is added into the bf16 buffer rounded once: at stages 0 and 1 every micro-batch (the last
// one's, with peers, all-reduced in fp32 per segment first, this rank's bf16 part widened into
// it), at 2 and 3 each reduce-scattered part. No rank sums in bf16.
//
// `local` (DiLoCo's inner steps, ZeRO 0): no gradient is summed; the replica steps on its own.
// The gradient sums travel in `wire` ([parallel] grad_comm; parallel/wire_reduce.h); ZeRO 3's
// weight all-gathers always in the working dtype.
//
// One object per run; every rank of the group calls the same methods in the same order.
//
//   ZeroStrategy z(store, layout, comm, bucket_elems, timeout_s);
//   Transformer model(cfg, dtype, B, T, rc, &z);
//   z.BeginStep(); for k: { z.BeginMicroBatch(last); model.ForwardBackward(...); }
//   z.FinishBackward(); double norm = std::sqrt(z.GradSquares()); ...; z.Update(lr, scale);
#pragma once

#include <memory>
#include <vector>

#include "keel/core/memory.h"
#include "keel/model/param_access.h"
#include "keel/model/params.h"
#include "keel/model/segment_pack.h"
#include "keel/optim/param_store.h"
#include "keel/parallel/comm.h"
#include "keel/train/grad_sync.h"

namespace keel::train {

class ZeroStrategy final : public model::ParamAccess {
 public:
  ZeroStrategy(optim::ParamStore& store, const model::ParamLayout& layout, parallel::Comm& comm,
               size_t bucket_elems, double timeout_s,
               parallel::GradWire wire = parallel::GradWire::kF32, bool local = false);
  ~ZeroStrategy() override;

  // After the master weights are set (init, checkpoint): the working weights from them.
  void PublishWeights();
  // After only the master's elements [lo, hi) of this rank's state changed (streaming DiLoCo's
  // fragment): those narrowed into the working copy, the rest as PublishWeights does. Where the
  // working copy is not the master's plain rounding in memory (ZeRO > 0, a tier, a compact
  // state), the whole of PublishWeights.
  void PublishWeights(size_t lo, size_t hi);

  void BeginStep();
  void BeginMicroBatch(bool last);
  // Waits for every gradient reduction of the step.
  void FinishBackward();
  // Σ g² over the data-parallel group's parameters, each counted once (frozen parameters'
  // gradients zeroed first): the square of the global norm when there is one stage.
  double GradSquares();
  void Update(float lr, float grad_scale);

  // Per step: milliseconds the step waited on communication it could not overlap, and the bytes
  // this rank sent (ring algorithms: an all-reduce of n bytes sends 2n(dp-1)/dp).
  double wait_ms() const { return wait_ms_; }
  double sent_bytes() const { return sent_bytes_; }
  double grad_sent_bytes() const { return grad_sent_bytes_; }  // of which the gradient sums'

  // int8 gradient sums' error-feedback residual (parallel/grad_wire.h), this rank's own: n floats
  // indexed as the layout's gradients; empty (n 0) without one. A checkpoint keeps it.
  float* residual() { return residual_.as<float>(); }
  size_t residual_elems() const { return residual_.bytes() / 4; }
  // Forgets it: under fp16 its units are the loss scale's, so a new scale (or an overflow's
  // skipped step, whose rounding it holds) starts it afresh.
  void ResetResidual() {
    if (residual_.bytes()) store_.backend().Zero(residual_.data(), residual_.bytes());
  }

  // The full fp32 master weights, gathered (every rank).
  std::vector<float> GatherMaster();
  // A compact state at ZeRO 3 (`packed`): the segments' packs and this rank's shard of them, in
  // 4-byte words, which TrainStep::SetWeights fills.
  bool packed() const { return packed_; }
  const std::vector<model::SegmentPack>& packs() const { return packs_; }
  parallel::ShardRange packed_shard() const { return own_; }
  // ZeRO-owned bytes beyond the store's (scratch, receive and gather buffers).
  size_t buffer_bytes() const;

  // model::ParamAccess
  const void* Weights(int s) override;
  const float* Biases() override;
  model::QuantizedWeights Quantized(int s) override;
  float* Grads(int s) override;
  void Use(int s, model::Pass p) override;
  void GradsDone(int s) override;

 private:
  struct Slot;
  size_t SlotOf(int s) const;  // 0: embeddings, 1: the final segment, 2 + parity: blocks
  Slot& GradSlot(int s);
  size_t OwnAt(int s) const;     // where this rank's part of segment s sits in the gathered one
  void StartGather(Slot& slot);  // the all-gather of a slot whose tier read is queued
  Slot& WeightSlot(int s);
  // Per rank: |[a,b) ∩ shard r| of `n` elements sharded over the group (0: the layout's total).
  std::vector<size_t> Counts(size_t a, size_t b, size_t n = 0) const;
  void Gather(int s, Slot& slot);
  void Wait(parallel::Work& w, const char* what);
  // Completes the slot's reduction and adds it to the gradients (ZeRO >= 2: the shard; stages 0
  // and 1 with bf16 gradients: rounds the all-reduced sum into them).
  void Drain(Slot& slot);
  void BucketDone(int s, Slot& slot);  // stages 0 and 1, bf16 gradients: see zero.cc
  void Publish();                      // the updated slice to whoever reads it
  void PublishBiases();
  // A compact state's trainable weights, all of them (ZeRO 1: gathered), into the working copy,
  // and in bf16 the trained ones that have an fp32 copy beside the biases (DoRA's magnitudes)
  // into it; the frozen ones (the base's biases among them) never change.
  // `adapters_only` (after an update): the frozen base is as it was, so a gathered segment
  // without adapters stays valid at ZeRO 3.
  void PublishCompact(bool adapters_only = false);
  // The trainable parameters' master weights, all of them: the store's, or gathered into `tmp`.
  const float* AllCompactMaster(Buffer& tmp);
  size_t ElemBytes() const;

  optim::ParamStore& store_;
  const model::ParamLayout& layout_;
  parallel::Comm& comm_;
  const int zero_, dp_;
  const bool bf16_grads_;  // optim.grad_dtype = "bf16": backward writes fp32 slots (Grads)
  // A compact state at ZeRO 3 (FSDP-QLoRA): the working copy is this rank's shard `own_` (4-byte
  // words) of the segments' packs, gathered per segment like stage 3's weights; the gradients are
  // all-reduced whole as at stages 0 and 1 (GradSync), the master sharded as at 1.
  const bool packed_;
  std::vector<model::SegmentPack> packs_;
  parallel::ShardRange own_;
  std::vector<size_t> trained_at_;  // each trainable range's first byte in the packed copy
  std::vector<char> seg_trained_;   // per segment: it holds a trainable range
  const parallel::GradWire wire_;   // [parallel] grad_comm
  const bool local_;                // DiLoCo's inner steps: each replica keeps its own gradients
  Buffer residual_;                 // int8's error feedback (GradResidualElems floats)
  const int L_;
  const double timeout_s_;
  std::unique_ptr<GradSync> sync_;  // stages 0 and 1
  bool last_micro_ = true;
  std::vector<std::unique_ptr<Slot>> grad_slots_, weight_slots_;  // stages 2-3, 3
  std::vector<char> fresh_;  // segment's scratch was handed out this micro-batch
  // A compact state's trained tensors with an fp32 copy (ParamInfo::bias_index): that copy's
  // index, their place in the compact master, their size.
  struct TrainedBias {
    size_t bias, master, numel;
  };
  std::vector<TrainedBias> trained_biases_;
  double wait_ms_ = 0, sent_bytes_ = 0, grad_sent_bytes_ = 0;
  void SentGrads(double bytes) {
    sent_bytes_ += bytes;
    grad_sent_bytes_ += bytes;
  }
};

}  // namespace keel::train

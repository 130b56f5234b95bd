// The shardable parameter store: the fp32 master weights, AdamW moments, gradients and working
// weights of one rank, and which slice of the flat layout each of them covers under the run's
// ZeRO stage. It owns the bytes and the update; the gradient strategy (train/zero.h) owns the
// communication that fills and publishes them.
//
//   stage  master, moments   grads          working weights
//   0      all               all            all (fp32: the master itself)
//   1      shard [lo, hi)    all            all
//   2      shard             shard          all
//   3      shard             shard          shard (bf16; fp32: the master shard)
//
// Every buffer is described by the flat index of its first element (`*_lo`), so the same
// offsets address a replica and a shard.
//
// A compact state (StateShape::trainable < total: LoRA's frozen base) keeps master weights,
// moments and gradients for the trainable parameters only, packed in layout order (the
// gradients as model::ParamLayout::grad_offset places them, a scratch for the frozen norms'
// after them): the state's flat indices count trainable elements, and ZeRO 1 shards that count.
// The working weights keep the layout's working offsets (model::ParamInfo::work_offset); the
// frozen ones live there alone (bf16 runs: as bf16) or, for a quantized base's matrices, as codes
// and scales; set once by TrainStep::SetWeights. ZeRO 0, 1 and 3: at 3 the master and moments are
// sharded as at 1 (the gradients stay whole: the adapters' are a few MB), and the working copy,
// codes and scales are this rank's shard of their packed form (model/segment_pack.h, in 4-byte
// words: parallel::Shard(StateShape::packed / 4)), which the ZeRO strategy gathers a segment at a
// time: the frozen base is sharded over the data-parallel group (FSDP-QLoRA).
//
// The moments are fp32 or bf16 (StateShape::moment_bytes; the hyper's bf16_moments is set from
// it). A bf16 run
// without a master (StateShape::master false; not compact) keeps no fp32 copy: the working
// copy's slice [state_lo, state_hi) is the weights AdamW updates (stochastically rounded).
//
// With [offload] (StateShape::offload_chunk) the moments, and a bf16 run's master, live on a disk
// tier (optim/offload_tier.h) instead: master() or adam_m() is then null, the update streams
// through the tier, and everything else reads and writes them with ReadState and WriteState,
// which serve resident state as well.
//
// With [offload] params (StateShape::working_offloaded: ZeRO 3, a 16-bit run) the working
// weights' shard is a region of the tier as well: the update rounds into it chunk by chunk, and
// the ZeRO strategy reads each segment's part of it (ReadState) before gathering the segment.
// Without a master it is the master (Kind::kMaster reads it).
//
// The host tier (StateShape::offload_host: [offload] host, a GPU's bf16 run) keeps them in pinned
// host memory instead, and AdamW runs on the CPU chunk by chunk: each chunk's gradients are
// copied from the device into a host staging buffer while the one before is updated, and its new
// bf16 weights are copied back after it.
//
//   ParamStore st(shape, dims, dp_rank, ranges, hyper);
//   st.Update(lr, clip_scale);   // AdamW over what this rank holds
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/core/memory.h"
#include "keel/kernels/backend.h"
#include "keel/optim/adamw.h"
#include "keel/optim/offload_tier.h"
#include "keel/parallel/dims.h"
#include "keel/parallel/state_bytes.h"

namespace keel::optim {

class ParamStore {
 public:
  // `ranges`: every parameter of the flat layout (offset, numel, decay, frozen), global offsets.
  // Every buffer in `be`'s memory, zeroed; the update runs there.
  ParamStore(const parallel::StateShape& shape, const parallel::ParallelDims& dims, int dp_rank,
             const std::vector<ParamRange>& ranges, const AdamWHyper& hyper,
             const kernels::Backend& be = kernels::Cpu(), const std::string& offload_dir = "");
  ~ParamStore();

  const parallel::ParallelDims& dims() const { return dims_; }
  const kernels::Backend& backend() const { return *be_; }
  DType dtype() const {
    return shape_.working_bytes == 2 ? (shape_.fp16 ? DType::kF16 : DType::kBF16) : DType::kF32;
  }
  size_t total() const { return shape_.total; }
  // This rank's ZeRO slice of the state's flat indices (also at stage 0: what it writes to
  // checkpoints); of the layout unless compact.
  const parallel::ShardRange& shard() const { return shard_; }

  // Compact: master and moments over the trainable parameters only (above).
  bool compact() const { return compact_; }
  // The trainable parameters as ranges of the compact state (offset) and of the layout (at), in
  // layout order; every range, frozen or not, when not compact.
  const std::vector<ParamRange>& trainable() const { return trainable_; }
  // Elements the state's flat indices count: trainable ones when compact, else total().
  size_t state_total() const { return compact_ ? shape_.trainable : shape_.total; }

  // Master weights and moments hold [state_lo(), state_hi()) of the state's flat indices.
  size_t state_lo() const { return state_lo_; }
  size_t state_hi() const { return state_hi_; }
  // The fp32 master; null without one (StateShape::master false).
  float* master() { return master_.as<float>(); }
  bool has_master() const { return shape_.master; }
  // The master's values over the slice, in master_dtype(): the fp32 master, or without one the
  // working copy's bf16 slice that stands for it (what checkpoints and replica checks read).
  void* master_data();
  DType master_dtype() const { return shape_.master ? DType::kF32 : DType::kBF16; }
  void* adam_m() { return opt_.m(); }  // moment_dtype() elements
  void* adam_v() { return opt_.v(); }
  DType moment_dtype() const { return opt_.moment_dtype(); }
  // The state by kind, wherever it lives: elements [lo, lo + n) of the slice (0 is state_lo())
  // to or from host memory, in state_dtype(k). For code off the update's path: checkpoints,
  // replica checks, loading weights.
  // kWorking: the working weights' slice [state_lo, state_hi) (ZeRO 3: the shard), in dtype();
  // on the tier with [offload] params, where nothing else holds it.
  enum class Kind { kMaster, kM, kV, kWorking };
  DType state_dtype(Kind k) const {
    return k == Kind::kMaster ? master_dtype() : k == Kind::kWorking ? dtype() : moment_dtype();
  }
  void ReadState(Kind k, size_t lo, size_t n, void* host);
  void WriteState(Kind k, size_t lo, size_t n, const void* host);
  // fn(p, lo, n) over the kind's whole slice, in the backend's memory: once, on its own memory,
  // where resident; piece by piece where offloaded (in host memory, or a GPU's bounce buffer for
  // the host tier), each piece written back after fn when `write`.
  void VisitState(Kind k, bool write, const std::function<void(void* p, size_t lo, size_t n)>& fn);
  // Whether the kind is on the offload tier (its pointer above is null).
  bool offloaded(Kind k) const;
  // ReadState(Kind::kWorking, ...) on the tier's I/O thread, behind what it has queued (the
  // weights on the tier only): a ticket for WaitState; `host` untouched until then.
  uint64_t ReadWorkingAsync(size_t lo, size_t n, void* host);
  void WaitState(uint64_t ticket) const { tier_->WaitRead(ticket); }
  const OffloadTier* tier() const { return tier_.get(); }
  // Gradients (grad_dtype() elements) from flat index grads_lo(): the whole layout, or the shard
  // (compact: the packed trainable ones, then the frozen norms' scratch). bf16
  // (StateShape::grad_bytes 2): the gradient strategy adds backward's fp32 buckets into them.
  void* grads() { return grads_.data(); }
  DType grad_dtype() const { return shape_.grad_bytes == 2 ? DType::kBF16 : DType::kF32; }
  size_t grads_lo() const { return grads_lo_; }
  size_t grads_size() const { return grads_size_; }
  // Working weights (dtype()) from flat index working_lo(); the master itself where it serves;
  // null where the tier holds them (offloaded(Kind::kWorking): read them with ReadState).
  void* working();
  size_t working_lo() const { return working_lo_; }
  float* biases() { return biases_.as<float>(); }  // fp32 biases (bf16 runs), compact
  // A quantized base's codes and scales (model::ParamLayout::quant_code_bytes, quant_scales);
  // null when the base is not quantized.
  uint8_t* codes() { return codes_.as<uint8_t>(); }
  float* scales() { return scales_.as<float>(); }

  // Frozen parameters' gradients to zero, in what this rank holds of the gradients.
  void ZeroFrozenGrads();
  // The frozen parameters' ranges, relative to grads() (flat indices when it holds them all).
  const std::vector<ParamRange>& frozen_grads() const { return frozen_; }
  // Σ g² over the gradients of the state slice [state_lo, state_hi), replicas left out (this
  // rank's part of the global norm; with ZeRO 0 and one stage the whole of it).
  double LocalGradSquares() const;
  // AdamW over [state_lo, state_hi); writes the rounded weights into the working copy where it
  // covers that slice (compact: not at all; ZeroStrategy publishes them).
  void Update(float lr, float grad_scale);
  int step() const { return opt_.step(); }
  void set_step(int s) { opt_.set_step(s); }

  // What this rank allocated, by kind: equals parallel::StateBytesPerRank(shape, dims).
  parallel::StateBytes bytes() const;

 private:
  parallel::StateShape shape_;
  const kernels::Backend* be_;
  parallel::ParallelDims dims_;
  bool compact_ = false;
  std::vector<ParamRange> trainable_;
  parallel::ShardRange shard_;
  size_t state_lo_ = 0, state_hi_ = 0, grads_lo_ = 0, grads_size_ = 0, working_lo_ = 0;
  Buffer master_, grads_, working_, biases_, codes_, scales_;
  std::vector<ParamRange> frozen_;    // frozen ranges, relative to grads()
  std::vector<ParamRange> replicas_;  // replica ranges in the state slice, relative to state_lo
  AdamW opt_;
  std::unique_ptr<OffloadTier> tier_;
  Buffer stage_;  // the host tier's staging: two chunks of gradients, one of bf16 weights
  // The host tier's update, chunk by chunk (param_store.cc).
  void UpdateThroughHost(bf16* w, const char* g, float lr, float grad_scale);
  // A chunk of the tier as AdamW's slice: its master (null where the tier holds none) and moments.
  AdamW::Slice TierSlice(void* const* p, size_t lo, size_t n) const;
  int Region(Kind k) const;  // the tier's region of an offloaded kind
  char* Resident(Kind k);    // a kind's memory where it is not offloaded
};

}  // namespace keel::optim

// The bytes of model state one rank holds under a ZeRO layout, by kind: what optim::ParamStore
// and the trainer's ZeRO strategy allocate, and what `keel plan --accounting keel` predicts. One
// formula for both, so that the planner's figure is the trainer's allocation to the byte.
//
//   StateShape sh = model::StateShapeOf(layout, DType::kBF16);   // GPT-2 124M's
//   sh.moment_bytes = 2;                                          // optim.state_dtype = "bf16"
//   StateBytes b = StateBytesPerRank(sh, {.dp = 4, .zero = 3});
#pragma once

#include <cstddef>
#include <vector>

#include "keel/parallel/dims.h"
#include "keel/parallel/grad_wire.h"

namespace keel::parallel {

// The run's choices that size its state beyond the model's shape (the [optim] dtypes, the
// master, the [offload] tier): filled once from a config (train::TiersOf) or a plan's job
// (plan::TiersOf) and laid onto a model's shape by WithTiers, so that the trainer, its memory
// check, the planner, preflight and the allocation test size one state.
struct StateTiers {
  int moment_bytes = 4;  // AdamW's m and v: 4 (fp32) or 2 (optim.state_dtype = "bf16")
  // The gradient buffer: 4 (fp32) or 2 (optim.grad_dtype = "bf16": backward's fp32 buckets are
  // added into it, rounded). Not compact.
  int grad_bytes = 4;
  // false: bf16 weights without an fp32 master (optim.master_weights = false); the working
  // copy's slice stands for it.
  bool master = true;
  // [offload]: AdamW's moments, and a bf16 run's fp32 master, on a disk tier instead of in
  // memory, streamed through three buffers of about this many bytes (0: all in memory).
  size_t offload_chunk = 0;
  // The tier is host memory ([offload] host: a GPU's master and moments, page-locked), not a
  // file; its chunk buffers are then the staging of the gradients (two chunks, copied from the
  // device ahead of the update) and of the bf16 weights (one chunk, copied back).
  bool offload_host = false;
  // [offload] params (ZeRO 3, a 16-bit run's disk tier): the working weights' shard is on the
  // tier too, read into the gathered segment before each all-gather, written by the update.
  bool offload_params = false;
  // [parallel] grad_comm: the data-parallel gradient sums' wire format; int8 keeps an fp32
  // error-feedback residual per gradient element (GradResidualElems).
  GradWire grad_comm = GradWire::kF32;
  // [parallel] dp_sync = "diloco": the outer loop's anchor and momentum, fp32 over the state;
  // streaming (fragments or overlap): its sends and averages too.
  bool diloco = false;
  bool diloco_streaming = false;
};

// A model's state (model::StateShapeOf) with the run's options on it.
struct StateShape : StateTiers {
  size_t total = 0;       // parameters in the flat layout
  size_t n_bias = 0;      // matrix-product biases, kept in fp32 beside bf16 working weights
  size_t embed = 0;       // segment 0 (embeddings)
  size_t final_norm = 0;  // the last segment
  size_t max_block = 0;   // the largest transformer block
  int working_bytes = 4;  // 4: fp32 run (the working weights are the master), 2: bf16
  bool fp16 = false;      // the 2-byte working copy is fp16 (train.precision = "fp16"), not bf16
  // Parameters that are trained (LoRA's adapters), when fewer than `total`: a compact state
  // (optim::ParamStore), whose master weights and moments cover these only. 0: all of them.
  size_t trainable = 0;
  // A compact state's gradient buffer (model::ParamLayout::grad_total: the trainable parameters'
  // gradients and the frozen norms' scratch).
  size_t grads = 0;
  // A compact state's working copy (model::ParamLayout::work_total: every weight but a quantized
  // base's matrices), and the bytes of those matrices' codes and scales (0: not quantized).
  size_t working = 0;
  size_t quantized = 0;
  size_t quant_scales = 0;  // of which fp32 scales (the rest: codes)
  // A compact state at ZeRO 3 shards that working copy and quantized base instead, as one run of
  // bytes (model::SegmentPacks: each segment's pieces padded to 64 bytes), and gathers it a
  // segment at a time into slots of `packed_slots` bytes in all (the embeddings', the final
  // LayerNorm's, two of the largest block's).
  size_t packed = 0, packed_slots = 0;
  bool compact() const { return trainable > 0 && trainable < total; }
  // Whether the master is on the tier: a bf16 run's (an fp32 run's master is its working
  // weights at ZeRO 0 and 3, and the source of the all-gather at 1 and 2).
  bool master_offloaded() const { return offload_chunk > 0 && master && working_bytes == 2; }
  // Whether the working weights' shard is ([offload] params on a 16-bit run's disk tier).
  bool working_offloaded() const {
    return offload_chunk > 0 && offload_params && working_bytes == 2 && !offload_host;
  }
  // The tier's regions' bytes per element, in their order in its file: the master and the
  // working weights where it holds them, then AdamW's m and v.
  std::vector<int> tier_regions() const {
    std::vector<int> r;
    if (master_offloaded()) r.push_back(4);
    if (working_offloaded()) r.push_back(2);
    r.insert(r.end(), 2, moment_bytes);
    return r;
  }
  size_t tier_bytes_per_elem() const {
    size_t b = 0;
    for (int x : tier_regions()) b += size_t(x);
    return b;
  }
};

inline StateShape WithTiers(StateShape s, const StateTiers& t) {
  static_cast<StateTiers&>(s) = t;
  return s;
}

// [offload]: the elements of each of the tier's chunks (a multiple of 2048, at most the state
// slice rounded up to one), for a slice of `held` elements.
size_t OffloadChunkElems(const StateShape& s, size_t held);
// The same for chunks of about `chunk_bytes` of `bytes_per_elem` (the regions' sum).
size_t OffloadChunkElems(size_t chunk_bytes, size_t bytes_per_elem, size_t held);
// The tier's chunk buffers, one allocation: up to three chunks (one read ahead, one computed on,
// one written back) of `bytes_per_elem` (its regions' sum) and a 4 KiB block to align them for
// O_DIRECT.
size_t OffloadBufferBytes(size_t held, size_t chunk_elems, size_t bytes_per_elem);

struct StateBytes {
  size_t working = 0;  // weights the forward pass reads (bf16 copy; fp32 ZeRO 1-2: a full copy;
                       // compact ZeRO 3: the packed copy's shard, quantized base included)
  size_t biases = 0;   // fp32 biases of bf16 runs
  size_t grads = 0;    // gradients (fp32, or bf16): all, or this rank's shard (ZeRO >= 2);
                       // compact: the trainable ones'
  size_t master = 0;   // fp32 master weights: all, or this rank's shard (ZeRO >= 1); compact:
                       // of the trainable parameters, and every working weight is kept; none
                       // without a master
  size_t moments = 0;  // AdamW m and v (fp32 or bf16), over what the master would cover
  // ZeRO >= 2 (not compact), or bf16 gradients: per-segment fp32 gradient scratch (the
  // embeddings, the final LayerNorm, two blocks in flight); ZeRO 3: also the gathered weights of
  // the same segments (compact: their packs);
  // bf16 gradients with tp or pp: the sums' scratch (GradSumScratchElems); int8 gradient sums:
  // the error-feedback residual (GradResidualElems; DiLoCo's pseudo-gradients' under diloco);
  // DiLoCo's anchor and momentum.
  size_t zero_buffers = 0;
  size_t quantized = 0;        // a quantized frozen base: codes and scales (compact states only)
  size_t offload_buffers = 0;  // [offload]: the tier's chunk buffers (up to three), or the host
                               // tier's staging (host memory, as the disk tier's)
  size_t tier = 0;             // [offload]: on the tier's disk, or host memory (not in total())
  size_t total() const {
    return working + biases + grads + master + moments + zero_buffers + quantized + offload_buffers;
  }
};

StateBytes StateBytesPerRank(const StateShape& s, const ParallelDims& d);

// bf16 gradients (grad_bytes 2) summed over tensor-parallel ranks or between the pipeline stages
// that share a tied embedding widen into one fp32 scratch of this many elements, a piece at a
// time (train::TrainStep); 0 where there are no such sums (fp32 gradients, or tp = pp = 1).
// Counted in StateBytes::zero_buffers.
size_t GradSumScratchElems(const StateShape& s, const ParallelDims& d);

// int8 gradient sums over dp > 1 ranks (grad_comm): the fp32 error-feedback residual's elements,
// one per element of the gradients this rank sends (every trained gradient, at every ZeRO stage:
// each rank encodes the whole before the owners sum). 0 otherwise. Counted in zero_buffers.
size_t GradResidualElems(const StateShape& s, const ParallelDims& d);

}  // namespace keel::parallel

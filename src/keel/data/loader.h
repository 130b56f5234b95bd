// Batches for training: a dataset cut into windows of T+1 tokens (inputs and next-token targets;
// SampleWindows: loss-masked datasets are packed by document and their untrained targets are -1),
// visited in a seeded order that changes every epoch, split among data-parallel ranks.
//
// The global sample sequence depends only on (dataset, T, seed): global sample g is window
// Permute_epoch(g mod n) with epoch = g / n. Step s's global batch is samples [s·GB, (s+1)·GB);
// rank r takes the contiguous part [r·GB/world, (r+1)·GB/world) of it, cut into micro-batches. So
// the union over ranks is exactly the single-process batch, whatever the rank count.
//
// The loader also keeps a cursor (the number of global samples consumed), so training can pull
// micro-batch after micro-batch with Next() and save/restore the position exactly. The cursor is
// counted in global samples, not in steps or per-rank samples, so a state saved by an N-rank run
// restores in an M-rank run: the global sequence continues, only its split differs.
//
//   BatchLoader loader(ds, /*T=*/256, /*global_batch=*/16, rank, world, seed, /*shuffle=*/true);
//   loader.Fill(step, micro, micro_batch, tokens, targets);   // (micro_batch, T) each
//   loader.Next(micro_batch, tokens, targets);                 // the cursor's next micro-batch
//   LoaderState st = loader.state();                           // at a step boundary
//   other.restore(st);
//
// With several weighted sources (BatchLoader(sources, weights, ...)) global sample g is
// BlendedSamples' sample g instead; everything else (the rank split, the cursor) is the same.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "keel/data/blend.h"
#include "keel/data/dataset.h"
#include "keel/data/windows.h"

namespace keel::data {

// A bijection of [0, n) chosen by (seed, round): a Feistel network on the next power of two with
// cycle walking. O(1) memory, every index exactly once.
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t seed, uint64_t round);
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t n_, seed_, round_;
  int half_bits_;
};

// Where a loader is in its global sample sequence, plus what identifies that sequence, so a
// restore into a loader over different data or windows is refused instead of silently training
// on another order.
struct LoaderState {
  uint64_t position = 0;        // global samples consumed (all ranks together)
  uint64_t seed = 0;            // shuffle seed
  int seq_len = 0;              // T
  uint64_t dataset_tokens = 0;  // TokenDataset::size(); for a blend, the sum over its sources
  // Only for a blend (empty for one dataset, so single-source states read and write as before):
  // the weights as configured and each source's size. Either changes which window global sample
  // g is, so a state saved for another blend must not restore.
  std::vector<double> weights;
  std::vector<uint64_t> source_tokens;
  // XXH3 of the shards' hashes in every source's meta.json (16 hex digits); "" when a source is a
  // flat file (no hashes to read). A dataset prepared again with other content of the same size
  // would otherwise restore and train on another order. Compared only when both states have one
  // (those saved before it existed restore as before).
  std::string content_xxh3;

  bool operator==(const LoaderState&) const = default;
};

nlohmann::json ToJson(const LoaderState& st);
// Throws keel::Error (bad input) naming a missing or mistyped field.
LoaderState LoaderStateFromJson(const nlohmann::json& j);

class BatchLoader {
 public:
  BatchLoader(const TokenDataset& ds, int T, int global_batch, int rank, int world, uint64_t seed,
              bool shuffle);
  // A weighted blend of several datasets (they must outlive the loader): global sample g is
  // BlendedSamples(sources, weights, T, seed)'s sample g, always shuffled. Throws keel::Error (bad
  // input) as BlendedSamples does. Each loader owns its schedule, which is not thread-safe: one
  // loader per rank and per thread.
  BatchLoader(std::vector<const TokenDataset*> sources, const std::vector<double>& weights, int T,
              int global_batch, int rank, int world, uint64_t seed);

  // For a blend, the first source's samples per epoch (each source wraps on its own).
  uint64_t samples_per_epoch() const { return n_samples_; }
  int local_batch() const { return global_batch_ / world_; }
  int global_batch() const { return global_batch_; }

  // Micro-batch `micro` (of local_batch()/micro_batch) of this rank at global step `step`.
  // Stateless: does not move the cursor.
  void Fill(int64_t step, int micro, int micro_batch, int32_t* tokens, int32_t* targets);

  // This rank's next micro-batch of micro_batch samples at the cursor. After local_batch() samples
  // of this rank the cursor moves on by one global batch. Starting from position 0, the k-th call
  // of a step gives exactly Fill(step, k, micro_batch, ...).
  void Next(int micro_batch, int32_t* tokens, int32_t* targets);

  // The targets trained on in the whole global batch at the cursor (every rank's part: each reads
  // the loss masks of all of them, so all ranks agree without a collective): the step's loss is
  // their mean. global_batch·T for data without a loss mask. At a step boundary only.
  uint64_t StepScored();
  bool masked() const;

  // The cursor. Only defined at a step boundary (no partial local batch consumed): mid-step the
  // position would depend on the rank split. Throws keel::Error (runtime) otherwise.
  LoaderState state() const;
  // Moves the cursor to st.position. Throws keel::Error (bad input) with one line naming the
  // field that differs when st was saved for another seed, seq_len or dataset size.
  void restore(const LoaderState& st);

 private:
  // What identifies the global sequence, with position_ (state() without the step check).
  LoaderState Identity() const;
  // Which window global sample g is (one dataset).
  uint64_t Sample(uint64_t g) const;
  // Fills n consecutive global samples starting at global sample `first`.
  void FillGlobal(uint64_t first, int n, int32_t* tokens, int32_t* targets);

  const TokenDataset* ds_;  // the only dataset, or the first source of a blend (for messages)
  std::unique_ptr<SampleWindows> windows_;    // one dataset's rows; null for a blend
  std::unique_ptr<BlendedSamples> blend_;     // null for one dataset
  std::vector<const TokenDataset*> sources_;  // a blend's sources; empty for one dataset
  std::vector<double> weights_;
  int T_, global_batch_, rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  uint64_t n_samples_;
  uint64_t position_ = 0;  // global samples before the current step
  int local_offset_ = 0;   // samples of this rank's part already taken in the current step
};

}  // namespace keel::data

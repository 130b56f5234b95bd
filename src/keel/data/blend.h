// Blending several token datasets with weights, as Megatron's BlendedDataset does: a
// deterministic interleave of the sources' own sample streams, so that every prefix of the
// blended sequence holds each source in (nearly) its weighted share.
//
//   BlendSchedule sched({0.7, 0.3});
//   auto [source, j] = sched.Locate(g);   // global sample g is sample j of `source`'s stream
//
//   BlendedSamples blend({&web, &code}, {0.7, 0.3}, /*T=*/256, /*seed=*/1234);
//   blend.Read(g, tokens, targets);        // global sample g's row (SampleWindows::Read)
#pragma once

#include <cstdint>
#include <vector>

#include "keel/data/dataset.h"
#include "keel/data/windows.h"

namespace keel::data {

// Maps global sample g to (source i, index j within source i's own stream). The rule is
// Megatron's greedy one: at each g pick the source whose realized count lies furthest below
// weight × (g+1), ties to the lowest index. Source i's picks get consecutive indices
// j = 0, 1, 2, ...: j is the number of times i was picked before g.
//
// Share bound: source i's count over the first N samples overshoots weight × N by less than 1
// always. It undershoots by less than 1 for every 1-3 source mix we tried (random 3-source mixes
// peak near 0.83); the greedy rule does not guarantee it in general: some mixes of 4+ sources
// with tiny weights fall 1.03-1.15 samples behind (pinned in blend_test.cc).
//
// Arithmetic is exact: weights are quantized to integers with sum ~2^48 and deficits are compared
// in 128-bit integers, so the schedule is the same on every machine and compiler (no dependence
// on FMA contraction or rounding of double products at large g).
//
// Cost: the greedy rule's state at g is the count vector, which has no closed form, so the
// schedule is built in blocks of kBlock samples and cached: the counts at each block start are
// kept (k × 8 bytes per block) and the block last touched is decoded in full. Sequential access
// is O(1) amortized per sample (O(k) per decoded sample); seeking to g not reached before costs
// O(g × k) once (a few seconds for 1e9 samples), and after that any seek at or below the
// furthest one costs O(kBlock × k). Not thread-safe (the cache mutates); use one per thread.
class BlendSchedule {
 public:
  static constexpr uint64_t kBlock = uint64_t(1) << 14;

  struct Location {
    int source;
    uint64_t index;  // within the source's own sample stream
  };

  // Throws keel::Error (bad input) for an empty list or a weight that is zero, negative or not
  // finite, naming the source index and the value.
  explicit BlendSchedule(const std::vector<double>& weights);

  int num_sources() const { return int(quantized_.size()); }
  // The normalized weight actually used (after quantization; equal to w_i / sum w to ~1e-14).
  double weight(int source) const;

  Location Locate(uint64_t g);

 private:
  // Decodes block b from its starting counts; records the counts at its end if they are new.
  void DecodeBlock(uint64_t b);

  std::vector<uint64_t> quantized_;  // W_i; shares are W_i / total_
  uint64_t total_ = 0;
  // checkpoints_[b] = per-source counts before sample b·kBlock.
  std::vector<std::vector<uint64_t>> checkpoints_;
  uint64_t cached_block_ = UINT64_MAX;
  std::vector<uint32_t> block_source_;
  std::vector<uint64_t> block_index_;
};

// The blended sample sequence over N datasets cut into windows of T+1 tokens. Sample j of source
// i is window Permutation_{i, epoch}(j mod n_i) with epoch = j / n_i, n_i = (size_i - 1) / T: each
// source is reshuffled every time its own stream wraps, independently of the others, with a seed
// derived from (seed, i). The datasets must outlive this object.
class BlendedSamples {
 public:
  // Throws keel::Error (bad input) for bad weights, a weight count that differs from the source
  // count, or a source too small for one window (naming its path).
  BlendedSamples(std::vector<const TokenDataset*> sources, const std::vector<double>& weights,
                 int T, uint64_t seed);

  int num_sources() const { return int(sources_.size()); }
  uint64_t samples_in_source(int source) const { return n_samples_[source]; }
  BlendSchedule& schedule() { return schedule_; }

  // The window (source, window index within that dataset) of global sample g.
  struct Window {
    int source;
    uint64_t window;
  };
  Window Resolve(uint64_t g);

  // Global sample g's inputs and targets (T each); returns the targets trained on.
  int Read(uint64_t g, int32_t* tokens, int32_t* targets);
  // Global sample g's targets trained on, from the loss mask alone.
  int Scored(uint64_t g);
  bool masked() const;  // some source is loss-masked

 private:
  std::vector<const TokenDataset*> sources_;
  std::vector<SampleWindows> windows_;
  BlendSchedule schedule_;
  int T_;
  std::vector<uint64_t> n_samples_;
  std::vector<uint64_t> source_seeds_;
};

}  // namespace keel::data

// Batches for training: a dataset cut into windows of T+1 tokens (inputs and next-token targets),
// visited in a seeded order that changes every epoch, split among data-parallel ranks.
//
// The global sample sequence depends only on (dataset, T, seed): global sample g is window
// Permute_epoch(g mod n) with epoch = g / n. Step s's global batch is samples [s·GB, (s+1)·GB);
// rank r takes the contiguous part [r·GB/world, (r+1)·GB/world) of it, cut into micro-batches. So
// the union over ranks is exactly the single-process batch, whatever the rank count.
//
//   BatchLoader loader(ds, /*T=*/256, /*global_batch=*/16, rank, world, seed, /*shuffle=*/true);
//   loader.Fill(step, micro, micro_batch, tokens, targets);   // (micro_batch, T) each
#pragma once

#include <cstdint>
#include <vector>

#include "keel/data/dataset.h"

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

class BatchLoader {
 public:
  BatchLoader(const TokenDataset& ds, int T, int global_batch, int rank, int world, uint64_t seed,
              bool shuffle);

  uint64_t samples_per_epoch() const { return n_samples_; }
  int local_batch() const { return global_batch_ / world_; }

  // Micro-batch `micro` (of local_batch()/micro_batch) of this rank at global step `step`.
  void Fill(int64_t step, int micro, int micro_batch, int32_t* tokens, int32_t* targets);

 private:
  const TokenDataset& ds_;
  int T_, global_batch_, rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  uint64_t n_samples_;
  std::vector<int32_t> window_;
};

}  // namespace keel::data

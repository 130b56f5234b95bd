// Silent data corruption: replicas that should hold the same bits (data-parallel copies of the
// weights, the reduced gradients) compare a hash of them; the ranks outside the majority are the
// suspects. With two replicas, or no strict majority, a disagreement has no culprit: every rank
// is named.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace keel::resilience {

struct Disagreement {
  std::vector<int> suspects;  // positions in `hashes` outside the majority; empty: all agree
  bool majority = false;      // the suspects were outvoted (false: no culprit could be told)
};

Disagreement FindDisagreement(const std::vector<uint64_t>& hashes);

// xxh3 of `bytes` bytes: what replicas compare.
uint64_t HashBytes(const void* data, size_t bytes);

}  // namespace keel::resilience

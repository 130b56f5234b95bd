#include "keel/data/loader.h"

#include <algorithm>
#include <cstring>

#include "keel/core/error.h"
#include "keel/core/rng.h"

namespace keel::data {

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t round)
    : n_(n), seed_(seed), round_(round) {
  int bits = 1;
  while ((uint64_t(1) << bits) < n) ++bits;
  half_bits_ = (bits + 1) / 2;
}

uint64_t Permutation::operator()(uint64_t i) const {
  const uint64_t mask = (uint64_t(1) << half_bits_) - 1;
  const Philox rng(seed_, round_);
  // Cycle walking: a Feistel network permutes [0, 4^half_bits); re-apply until inside [0, n).
  // Each application is a bijection, so the walk ends and the result is a bijection of [0, n).
  uint64_t x = i;
  do {
    uint64_t left = x >> half_bits_, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      uint64_t f = rng.Bits((uint64_t(r) << 40) ^ right)[0] & mask;
      uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= n_);
  return x;
}

BatchLoader::BatchLoader(const TokenDataset& ds, int T, int global_batch, int rank, int world,
                         uint64_t seed, bool shuffle)
    : ds_(ds),
      T_(T),
      global_batch_(global_batch),
      rank_(rank),
      world_(world),
      seed_(seed),
      shuffle_(shuffle),
      window_(size_t(T) + 1) {
  n_samples_ = ds.size() > 0 ? (ds.size() - 1) / size_t(T) : 0;
  if (n_samples_ == 0)
    ThrowBadInput("data " + ds.path() + ": " + std::to_string(ds.size()) +
                  " tokens is too few for one sample of seq_len + 1 = " + std::to_string(T + 1));
}

void BatchLoader::Fill(int64_t step, int micro, int micro_batch, int32_t* tokens,
                       int32_t* targets) {
  const uint64_t first = uint64_t(step) * global_batch_ + uint64_t(rank_) * local_batch() +
                         uint64_t(micro) * micro_batch;
  for (int b = 0; b < micro_batch; ++b) {
    const uint64_t g = first + b;
    const uint64_t epoch = g / n_samples_, pos = g % n_samples_;
    const uint64_t sample = shuffle_ ? Permutation(n_samples_, seed_, epoch)(pos) : pos;
    ds_.Read(sample * T_, size_t(T_) + 1, window_.data());
    std::memcpy(tokens + size_t(b) * T_, window_.data(), sizeof(int32_t) * T_);
    std::memcpy(targets + size_t(b) * T_, window_.data() + 1, sizeof(int32_t) * T_);
  }
}

}  // namespace keel::data

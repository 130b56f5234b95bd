// How a run is laid out over its ranks: data-parallel replicas (dp), tensor-parallel shards (tp),
// pipeline stages (pp), and the ZeRO stage over the data-parallel group. One type for the planner
// and the trainer, validated in one place.
//
// Ranks are numbered with tp innermost, then dp, then pp (Megatron-LM's order): ranks that share
// a tensor-parallel group are neighbours, so on a GPU node they share NVLink.
//
//   ParallelDims d{/*dp=*/4, /*tp=*/1, /*pp=*/1, /*zero=*/3};
//   ValidateDims(d, {.world = 4, .n_head = 12, .n_layer = 12, .padded_vocab = 50304,
//                    .global_batch = 16, .micro_batch = 4});       // throws one line
//   RankCoords c = Coords(d, rank);                                  // c.dp, c.tp, c.pp
//   ShardRange s = Shard(total_params, d.dp, c.dp);                  // this rank's ZeRO slice
#pragma once

#include <cstddef>
#include <string>

namespace keel::parallel {

struct ParallelDims {
  int dp = 1, tp = 1, pp = 1;
  int zero = 0;  // 0: replicated; 1: optimizer state sharded over dp; 2: + gradients; 3: + weights
  int world() const { return dp * tp * pp; }
  bool operator==(const ParallelDims&) const = default;
};

// What a layout must divide. A field left at 0 is not checked (the planner has no data files).
struct DimsInputs {
  long world = 0;         // ranks launched
  long n_head = 0;        // must be divisible by tp
  long n_layer = 0;       // must be divisible by pp
  long n_kv_head = 0;     // must be divisible by tp (grouped-query attention)
  long ffn_hidden = 0;    // must be divisible by tp
  long padded_vocab = 0;  // must be divisible by tp
  long global_batch = 0;  // sequences per step: divisible by dp x micro_batch
  long micro_batch = 0;
};

// Throws keel::Error (bad input, exit 2) with one line naming the keys and the numbers, e.g.
// "[parallel] tp=4 x pp=1 x dp=1 = 4 does not match the 6 ranks launched". `prefix` names the
// keys' section ("[parallel] " for the trainer, "plan: " for the planner).
void ValidateDims(const ParallelDims& d, const DimsInputs& in,
                  const std::string& prefix = "[parallel] ");

struct RankCoords {
  int dp = 0, tp = 0, pp = 0;
};
RankCoords Coords(const ParallelDims& d, int rank);
int RankOf(const ParallelDims& d, const RankCoords& c);

// The contiguous slice [lo, hi) of a flat buffer of `total` elements that data-parallel rank r
// of `dp` owns under ZeRO: slices of ceil(total/dp) elements (the last may be shorter or empty),
// so that every rank's shard buffer has the same size (`size`).
struct ShardRange {
  size_t lo = 0, hi = 0;
  size_t size = 0;  // ceil(total/dp): the buffer each rank allocates
  size_t numel() const { return hi - lo; }
};
ShardRange Shard(size_t total, int dp, int r);

// "dp=2 tp=1 pp=1 zero=3", for logs.
std::string DimsName(const ParallelDims& d);

}  // namespace keel::parallel

// Where a run's ranks are: data-parallel replicas (dp), tensor-parallel shards (tp), pipeline
// stages (pp), and the ZeRO stage over the data-parallel group. The rank geometry of the whole
// layout (layout.h: parallel::Layout, which derives from it and validates both).
//
// Ranks are numbered with tp innermost, then dp, then pp (Megatron-LM's order): ranks that share
// a tensor-parallel group are neighbours, so on a GPU node they share NVLink.
//
//   ParallelDims d{/*dp=*/4, /*tp=*/1, /*pp=*/1, /*zero=*/3};
//   RankCoords c = Coords(d, rank);                                  // c.dp, c.tp, c.pp
//   ShardRange s = Shard(total_params, d.dp, c.dp);                  // this rank's ZeRO slice
#pragma once

#include <cstddef>
#include <string>

namespace keel::parallel {

struct ParallelDims {
  // The context-parallel size (cp) goes here, beside tp (Coords, RankOf, world()).
  int dp = 1, tp = 1, pp = 1;
  int zero = 0;  // 0: replicated; 1: optimizer state sharded over dp; 2: + gradients; 3: + weights
  int world() const { return dp * tp * pp; }
  bool operator==(const ParallelDims&) const = default;
};

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

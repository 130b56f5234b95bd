// Where a run's ranks are: data-parallel replicas (dp), tensor-parallel shards (tp), pipeline
// stages (pp), context-parallel parts of each sequence (cp), and the ZeRO stage over the ranks
// that hold the same parameters (dp x cp of them: replicas()). The rank geometry of the whole
// layout (layout.h: parallel::Layout, which derives from it and validates both).
//
// Ranks are numbered with tp innermost, then cp, then dp, then pp (Megatron-LM's order): ranks
// that share a tensor-parallel group are neighbours, so on a GPU node they share NVLink, and the
// context-parallel ring, which moves keys and values every layer, comes next.
//
// A context-parallel rank computes the gradients of its part of each sequence for the same
// parameters as its cp peers: for the gradients, ZeRO and the checkpoints it is one more
// replica (Megatron-LM's dp-cp group), numbered ReplicaOf(d, c) = c.dp·cp + c.cp.
//
//   ParallelDims d{/*dp=*/4, /*tp=*/1, /*pp=*/1, /*zero=*/3};
//   RankCoords c = Coords(d, rank);                                  // c.dp, c.tp, c.pp, c.cp
//   ShardRange s = Shard(total_params, d.replicas(), ReplicaOf(d, c)); // this rank's ZeRO slice
#pragma once

#include <cstddef>
#include <string>

namespace keel::parallel {

struct ParallelDims {
  int dp = 1, tp = 1, pp = 1;
  int zero = 0;  // 0: replicated; 1: optimizer state sharded over dp; 2: + gradients; 3: + weights
  int cp = 1;    // last, so that {dp, tp, pp, zero} initializers keep meaning what they did
  int world() const { return dp * cp * tp * pp; }
  // The ranks that hold the same parameters (same tp and pp): the gradient and ZeRO group.
  int replicas() const { return dp * cp; }
  bool operator==(const ParallelDims&) const = default;
};

struct RankCoords {
  int dp = 0, tp = 0, pp = 0, cp = 0;
};
RankCoords Coords(const ParallelDims& d, int rank);
int RankOf(const ParallelDims& d, const RankCoords& c);
// The rank's place in its gradient group (same tp and pp): c.dp·cp + c.cp.
inline int ReplicaOf(const ParallelDims& d, const RankCoords& c) { return c.dp * d.cp + c.cp; }

// The contiguous slice [lo, hi) of a flat buffer of `total` elements that data-parallel rank r
// of `dp` owns under ZeRO: slices of ceil(total/dp) elements (the last may be shorter or empty),
// so that every rank's shard buffer has the same size (`size`).
struct ShardRange {
  size_t lo = 0, hi = 0;
  size_t size = 0;  // ceil(total/dp): the buffer each rank allocates
  size_t numel() const { return hi - lo; }
};
ShardRange Shard(size_t total, int dp, int r);

// "dp=2 tp=1 pp=1 zero=3" (and " cp=2" where cp > 1), for logs.
std::string DimsName(const ParallelDims& d);

}  // namespace keel::parallel

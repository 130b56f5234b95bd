// The process groups of a layout (dims.h's coordinates), split from the world communicator:
//
//   tp    the ranks sharing one model's layers as tensor-parallel shards (same dp and pp),
//         neighbours in rank order: the f/g all-reduces of every block;
//   dp    the ranks holding the same parameters (same tp and pp coordinates): gradient
//         reduction and ZeRO;
//   pp    the stages of this rank's pipeline, in stage order (same dp and tp): activations and
//         their gradients, point to point;
//   tied  the first and last stage of this pipeline: the tied embedding's gradient is summed
//         between them (a middle stage gets a group of itself, unused).
//
// Collective over the world: every rank calls MakeGroups once, at the same point.
//
//   Groups g = MakeGroups(*world, dims);
//   g.dp->size() == dims.dp; g.pp->rank() == g.at.pp
#pragma once

#include <memory>

#include "keel/parallel/comm.h"
#include "keel/parallel/dims.h"

namespace keel::parallel {

struct Groups {
  RankCoords at;
  std::unique_ptr<Comm> tp, dp, pp, tied;
};

Groups MakeGroups(Comm& world, const ParallelDims& dims);

}  // namespace keel::parallel

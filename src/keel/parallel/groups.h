// The process groups of a layout (layout.h; dims.h's coordinates), split from the world
// communicator:
//
//   tp    the ranks sharing one model's layers as tensor-parallel shards (same dp and pp),
//         neighbours in rank order: the f/g all-reduces of every block;
//   dp    the ranks holding the same parameters (same tp and pp coordinates): gradient
//         reduction and ZeRO; with context parallelism, the cp peers too (dims.h: replicas());
//   cp    the ranks holding the parts of the same sequences (same dp, tp and pp): keys and
//         values in every layer's attention (model/context_parallel.h);
//   pp    the stages of this rank's pipeline, in stage order (same dp and tp): activations and
//         their gradients, point to point;
//   tied  the first and last stage of this pipeline: the tied embedding's gradient is summed
//         between them (a middle stage gets a group of itself, unused).
//
// With `nccl` (a GPU run), dp, pp and tied also get NCCL communicators over the same ranks, which
// move the step's device buffers; the split groups bootstrap them and keep carrying host values.
// The caller binds this rank to its GPU first (kernels::Get(kCuda): parallel/ cannot reach the
// backend), as NCCL takes the device current at its creation.
//
// Collective over the world: every rank calls MakeGroups once, at the same point, with the same
// `nccl`.
//
//   Groups g = MakeGroups(*world, layout, /*nccl=*/false);
//   g.dp->size() == layout.replicas(); g.pp->rank() == g.at.pp
//   train::TrainStep step(spec, g.ForStep());
#pragma once

#include <memory>

#include "keel/parallel/comm.h"
#include "keel/parallel/layout.h"

namespace keel::parallel {

// The groups one training step talks to (train::TrainStep), not owned; null: none (one stage, no
// tied sum).
struct StepGroups {
  Comm* dp = nullptr;  // required
  Comm* pp = nullptr;
  Comm* tied = nullptr;
  Comm* tp = nullptr;
  Comm* cp = nullptr;  // null or size 1: whole sequences
};

struct Groups {
  RankCoords at;
  std::unique_ptr<Comm> tp, dp, pp, tied, cp;
  // With nccl: over the ranks of dp, pp and tied, which they borrow; declared after them, so
  // that they go first.
  std::unique_ptr<Comm> nccl_dp, nccl_pp, nccl_tied;

  // The step's groups: NCCL's where there are, the split ones otherwise.
  StepGroups ForStep() const;
};

Groups MakeGroups(Comm& world, const Layout& layout, bool nccl = false);

}  // namespace keel::parallel

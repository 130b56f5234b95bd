// A run's whole parallel layout, one object shared by the trainer (train::ResolveLayout reads it
// from the config), the step (train::StepSpec) and the planner (plan::Layout): the rank geometry
// (ParallelDims: dp, tp, pp, zero) and how a step runs over it (sequence parallelism, interleaved
// or uneven pipeline stages, micro-batches). It checks itself (Validate) and builds its own
// process groups (groups.h: MakeGroups).
//
// A new dimension goes: a field here (in ParallelDims if it moves ranks: Coords, world()), its
// rules in Validate, its group in MakeGroups, its costs in plan/ (docs/ARCHITECTURE.md).
//
//   Layout l;                        // dp 1, tp 1, pp 1, zero 0: one micro-batch of 1
//   l.dp = 4, l.zero = 3, l.micro_batch = 4;
//   l.Validate({.world = 4, .n_head = 12, .n_layer = 12, .padded_vocab = 50304,
//               .global_batch = 16});                             // throws one line
//   RankCoords c = Coords(l, rank);                                // its ParallelDims part
#pragma once

#include <string>
#include <vector>

#include "keel/parallel/dims.h"
#include "keel/parallel/zigzag.h"

namespace keel::parallel {

// What a layout must divide. A field left at 0 is not checked (the planner has no data files).
struct LayoutInputs {
  long world = 0;         // ranks launched
  long n_head = 0;        // must be divisible by tp
  long n_layer = 0;       // divisible by pp (equal stages) or by pp x virtual_stages; or the
                          // sum of stage_layers
  long n_kv_head = 0;     // must be divisible by tp (grouped-query attention)
  long ffn_hidden = 0;    // must be divisible by tp
  long padded_vocab = 0;  // must be divisible by tp
  long global_batch = 0;  // sequences per step: divisible by dp x micro_batch
  long seq_len = 0;       // tokens per sequence: divisible by 2 x cp; with sp, micro_batch x
                          // seq_len / cp divisible by tp
};

struct Layout : ParallelDims {
  // ParallelDims: dp, tp, pp, zero, cp (context parallelism: parallel/zigzag.h splits each
  // sequence over cp ranks).
  bool sp = false;                 // sequence parallelism: the residual stream split over tp
  CpComm cp_comm = CpComm::kRing;  // context parallelism's keys and values (zigzag.h)
  int virtual_stages = 1;          // model chunks per pipeline rank (> 1: interleaved 1F1B)
  std::vector<int> stage_layers;   // blocks per pipeline stage (virtual_stages 1); empty: equal
  int micro_batch = 1;             // sequences per micro-batch per data-parallel rank
  int n_micro = 1;                 // micro-batches per step (gradient accumulation)

  // Every rule, in this order: ValidateRanks, the global batch over dp x micro_batch,
  // ValidateSchedule. Throws keel::Error (bad input, exit 2) with one line naming the keys and
  // the numbers, e.g. "[parallel] tp=4 x pp=1 x dp=1 = 4 does not match the 6 ranks launched".
  // `prefix` names the keys' section ("[parallel] " for the trainer, "plan: " for the planner).
  void Validate(const LayoutInputs& in, const std::string& prefix = "[parallel] ") const;

  // Validate's steps, for a caller that checks the stage list and the batch in its own keys'
  // words between them (train::ResolveLayout: a config's pp_layers and batch_size).
  //   Ranks: dp, tp, pp >= 1, the ZeRO stage, the ranks launched, tp dividing the model's heads,
  //   key/value heads, hidden units and vocabulary, the layers over the stages.
  //   Schedule: sp, virtual_stages, and the pipeline's (ZeRO <= 1, enough micro-batches).
  void ValidateRanks(const LayoutInputs& in, const std::string& prefix = "[parallel] ") const;
  void ValidateSchedule(const LayoutInputs& in, const std::string& prefix = "[parallel] ") const;

  bool operator==(const Layout&) const = default;
};

}  // namespace keel::parallel

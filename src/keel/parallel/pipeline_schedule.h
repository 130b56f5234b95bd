// The pipeline schedules, as integer bookkeeping shared by the trainer (train/pipeline.h runs
// them) and the planner (which sizes the activations they keep):
//
//   1F1B (PipeDream-Flush; v = 1): stage s of p runs w = min(p - s - 1, m) warm-up forwards,
//       then alternates one forward and one backward, then drains the last w backwards.
//   Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM; v > 1): each rank holds v chunks of
//       the model, chunk c of rank s being virtual stage c·p + s. Forwards take the chunks in
//       turn, p micro-batches at a time; backwards the same in reverse chunk order; the warm-up
//       is (p - s - 1)·2 + (v - 1)·p units. The bubble shrinks by v, for v times the
//       point-to-point traffic. Needs m % p == 0.
//
//   auto units = PipelineUnits(/*p=*/2, /*s=*/0, /*v=*/2, /*m=*/4);
//   for (const PipeUnit& u : units) ...   // u.forward, u.chunk, u.micro
#pragma once

#include <vector>

namespace keel::parallel {

struct PipeUnit {
  bool forward = true;
  int chunk = 0;  // which of this rank's v chunks
  int micro = 0;  // which micro-batch
};

// The order in which stage s of p runs the forward and backward of its m·v units.
std::vector<PipeUnit> PipelineUnits(int p, int s, int v, int m);

// Per chunk: the most micro-batches whose activations the schedule keeps at once (forward done,
// backward not yet), i.e. the activation slots the chunk needs. 1F1B: min(p - s, m).
std::vector<int> PipelineSlots(int p, int s, int v, int m);

// The idle fraction of an ideal schedule: (p - 1) / (m + p - 1), divided by v when interleaved.
double PipelineBubble(int p, int m, int v = 1);

}  // namespace keel::parallel

// Where one training step's wall time went, phase by phase, so that an hour of a run shows what
// its compute was and where the rest went. The phases tile the step: `other` is what the timed
// ones leave of the step's wall time (loop overhead, untimed small collectives), so a phase timed
// twice shows up as a negative `other`, and the metrics test holds |other| under 2% of the step.
//
//   monitor::StepTimes t;
//   t[monitor::Phase::kForward] += ms;
//   t.CloseWith(step_ms);          // sets kOther
//   line[monitor::PhaseKey(p)] = t[p];
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace keel::monitor {

enum class Phase {
  kData,        // waiting for the next micro-batch (the prefetcher did not keep up)
  kForward,     // forward compute, communication waits excluded
  kHead,        // the fused classifier and loss (logits, softmax, their gradients), waits excluded
  kBackward,    // the rest of backward compute and gradient accumulation, waits excluded
  kCommDp,      // exposed data-parallel communication (gradient reduce, ZeRO gathers)
  kCommTp,      // exposed tensor-parallel communication
  kCommCp,      // exposed context-parallel communication (keys, values and their gradients)
  kCommPp,      // waiting for a pipeline neighbour (the bubble)
  kCommTied,    // the tied embedding's gradient sum across pipeline stages
  kSync,        // at the step's end, waiting for the slowest rank (the save/stop agreement)
  kOptimizer,   // gradient norm, clipping, AdamW, publishing the new weights
  kCheckpoint,  // what the step waited for a save (snapshot staging, the blocking part)
  kChecks,      // anomaly checks: replica hashes, straggler scores
  kValidation,  // the periodic validation pass
  kOther,
  kCount
};
constexpr size_t kPhases = size_t(Phase::kCount);

// The metrics.jsonl key ("forward_ms") and the short name used on the console and as the
// Prometheus label ("forward").
const char* PhaseKey(Phase p);
const char* PhaseName(Phase p);

struct StepTimes {
  std::array<double, kPhases> ms{};

  double& operator[](Phase p) { return ms[size_t(p)]; }
  double operator[](Phase p) const { return ms[size_t(p)]; }
  // Sets kOther to `total_ms` less the other phases.
  void CloseWith(double total_ms);
  double Sum() const;  // every phase, kOther included
};

// " | fwd 31% bwd 60% dp 3% opt 5%": the phases of at least 1% of `total_ms`, for the step line.
std::string ShareLine(const StepTimes& t, double total_ms);

}  // namespace keel::monitor

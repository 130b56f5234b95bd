// Fault injection for tests and drills: KEEL_FAULT names faults, each at a step and a rank, that
// the trainer applies at fixed points of the step, so that every detector of docs/RESILIENCE.md
// can be shown to catch what it claims.
//
//   KEEL_FAULT="nan_grad@5:1; slow@0:1,factor=2; bitflip@12:2,param=h.0.attn.c_attn.weight"
//
// A fault is KIND@STEP[:RANK][,key=value|flag ...]; STEP is the 0-based index of the step it
// strikes (the step that ends with `step_done` = STEP + 1), RANK the global rank (omitted: every
// rank). Kinds:
//   kill      SIGKILL this rank before the step's update
//   hang      stop in `phase` (data, forward, backward, optimizer, checkpoint; default backward)
//             for good: the heartbeat says where, the process never continues
//   slow      from STEP on, every step's compute takes `factor` times as long (default 2)
//   bitflip   flip bit `bit` (default 0) of element `index` (default 0) of parameter `param` in
//             this rank's fp32 master weights; `persistent` repeats it when the step is re-run
//   nan_grad  NaN gradients on this rank (its backward is scaled by NaN), before the reduction
//   spike     a corrupted batch: the targets of this rank's micro-batches replaced by ids spread
//             over the whole vocabulary (garbage data, a loss near log(vocab) or above)
//   sigterm   raise SIGTERM in this rank after the step
// A fault fires once per run, restarts included: it leaves a marker in RUN/faults/ before it
// strikes, so a supervised run that resumes from before STEP does not meet it again (except slow,
// which lasts). Unset, KEEL_FAULT costs one getenv.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace keel::resilience {

enum class FaultKind { kKill, kHang, kSlow, kBitflip, kNanGrad, kSpike, kSigterm };

struct Fault {
  FaultKind kind = FaultKind::kKill;
  int step = 0;
  int rank = -1;  // -1: every rank
  std::string phase = "backward";
  double factor = 2.0;
  std::string param;
  size_t index = 0;
  int bit = 0;
  bool persistent = false;
  int id = 0;  // its position in the spec, for the fired marker
};

// Parses a KEEL_FAULT value; throws keel::Error (bad input) naming the fault and what was expected.
std::vector<Fault> ParseFaults(const std::string& spec);
const char* FaultKindName(FaultKind k);
// Faults that could never strike this job are errors too (a drill that silently does nothing is
// worse than none): a rank outside the job, a step past its end, or a bitflip whose parameter or
// element `bad_param` refuses (it returns why, or "").
void CheckFaultsStrike(const std::vector<Fault>& faults, int world, int steps,
                       const std::function<std::string(const Fault&)>& bad_param);

class FaultInjector {
 public:
  FaultInjector() = default;
  // From the environment's KEEL_FAULT, the faults that concern `rank`.
  static FaultInjector FromEnv(int rank);
  bool empty() const { return faults_.empty(); }
  // Where the fired markers go (RUN/faults); without it, faults fire once per process.
  void SetMarkerDir(const std::string& dir);
  // The fault of `kind` that strikes step `step`, not fired before, marked fired now; nullptr if
  // none. For slow: the newest one whose step is <= `step` (it lasts), never marked.
  // `phase`, for hang: only a fault in that phase.
  const Fault* Take(FaultKind kind, int step, const std::string& phase = "");
  // A persistent fault taken at or before `step`: it strikes again when the step is re-run.
  const Fault* Repeat(FaultKind kind, int step) const;

 private:
  bool Fired(const Fault& f) const;
  std::vector<Fault> faults_;
  std::vector<bool> fired_;
  std::string marker_dir_;
  int rank_ = 0;
};

}  // namespace keel::resilience

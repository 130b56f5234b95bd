// StepGuards: the one seam between the training loop and everything that watches a step — the
// injected faults (KEEL_FAULT), the hang watchdog and the heartbeat's phases, the NaN/spike judge,
// rollbacks and the data they skip, the replicas' silent-corruption check and the straggler
// scores (docs/RESILIENCE.md). The loop calls one hook at each point of the step; a detector
// lives in resilience/ and is wired in here at the hook where it looks.
//
//   StepGuards guards(run, heartbeat);             // collective (hosts, data-parallel ranks)
//   for (int i = run.start_step; ...) {
//     guards.BeforeStep(i);                        // skips data, arms the watchdog, faults
//     loss = ForwardBackward(guards.dloss(run.dloss), next = guards.Batch(...));
//     guards.AfterBackward(&loss, &compute_ms);    // slow fault, replica check (may re-run)
//     const StepGuards::Verdict v = guards.Decide(loss, norm);
//     if (v.resume_at >= 0) { i = v.resume_at - 1; continue; }   // rolled back
//     if (v.apply) step.Apply(...);
//     guards.AfterUpdate(v.apply, loss, norm);
//     guards.AfterStep(loss, &fig, &extra);        // heartbeat, stragglers
//     guards.BeforeSave();                         // sigterm fault, checkpoint phase
//   }
//   guards.Finish();
//
// Every rank calls every hook at the same step: the judge sees reduced numbers, so all ranks
// skip or roll back alike without a collective of their own; the replica and straggler checks
// are collectives of their own on the steps they run.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "keel/resilience/fault_inject.h"
#include "keel/resilience/heartbeat.h"
#include "keel/resilience/straggler.h"
#include "keel/resilience/watchdog.h"
#include "keel/train/guards.h"
#include "keel/train/pipeline.h"
#include "keel/train/run_setup.h"
#include "keel/train/step_report.h"

namespace keel::train {

// The recent losses a checkpoint's state keeps (StepGuards::State), read back. A skipped step's
// NaN or infinite loss is written as null (JSON has no such numbers) and reads as NaN: read as a
// double it threw, and every resume or rollback from that checkpoint with it.
std::vector<double> RecentLossesFromJson(const nlohmann::json& j);

class StepGuards {
 public:
  // Collective over the world (hosts) and the data-parallel group. Restores the detectors' state
  // of the checkpoint the run resumed from. Not for a finished run (run.sum.nothing_left).
  StepGuards(Run& run, resilience::HeartbeatWriter& heartbeat);
  ~StepGuards();

  // Before step `step_i` (0-based) touches its data: the batches due to be skipped here, the
  // watchdog armed, the faults of this step's data and forward phases.
  void BeforeStep(int step_i);
  // The loss gradient's seed for this step's backward: `dloss`, or NaN (a nan_grad fault).
  float dloss(float dloss) const { return nan_fault_ ? NAN : dloss; }
  // The step's data source: `next`, its targets corrupted by a spike fault, and its micro-batches
  // kept on a silent-corruption step (for a re-run).
  NextBatch Batches(const NextBatch& next);
  // After forward and backward: `compute_ms` stretched by a slow fault; on a silent-corruption
  // step the replicas compare (a repaired step re-runs: `loss` is its new one). Returns the
  // checks' milliseconds.
  double AfterBackward(double* loss, double* compute_ms);

  struct Verdict {
    bool apply = true;   // the update goes in (a finite step that asks for no rollback)
    int resume_at = -1;  // >= 0: rolled back; the loop continues at this step
  };
  // The step's fate from its reduced loss and gradient norm (the same on every rank): skipped when
  // non-finite, rolled back on a spike (to the newest checkpoint before it, skipping its data).
  Verdict Decide(double loss, double norm);
  // After the update (or its skip): the judge's windows take an applied step; a bitflip fault.
  void AfterUpdate(bool applied, double loss, double norm);
  // The step is done: the heartbeat, the straggler check (collective on its steps: `fig` gets
  // its scores) and the loss record.
  void AfterStep(double loss, StepFigures* fig, nlohmann::json* extra);
  // Before the save decision: the sigterm fault, the heartbeat's checkpoint phase.
  void BeforeSave();
  // The heartbeat's phase for the current step (`done` steps done), e.g. "validate".
  void Phase(int done, const char* phase) { heartbeat_.Set(done, phase); }
  void Finish(int steps_done);  // the watchdog off, the heartbeat's final phase

  // The detectors' state in a checkpoint ("resilience" and "metrics"), and back.
  nlohmann::json State() const;
  void Restore(const nlohmann::json& state);

 private:
  // The heartbeat's phase, and a hang fault in it (`done`: the steps the heartbeat reports).
  void HangIfDue(const char* phase, int done);
  // Back to the newest checkpoint at or before the current step; -1 when there is none.
  int RollBack(const std::string& why);
  void RerunKept(double* loss);

  Run& run_;
  resilience::HeartbeatWriter& heartbeat_;
  const ResilienceSection& rs_;
  resilience::FaultInjector faults_;
  RollbackLog rollbacks_;
  StepJudge judge_;
  resilience::StragglerTracker stragglers_;
  std::vector<std::string> hosts_;
  std::vector<double> dp_world_ranks_;  // the world rank of each data-parallel peer
  bool sdc_on_ = false;
  std::optional<resilience::HangWatchdog> watchdog_;
  std::vector<double> recent_losses_;  // the last few, for the log's record; kept across resumes
  double compute_since_ = 0;           // this rank's compute (ms) since the last straggler check

  int step_i_ = 0;  // the step under way (0-based)
  bool spike_fault_ = false, nan_fault_ = false, sdc_step_ = false;
  std::vector<int32_t> kept_;  // the step's micro-batches, for a re-run
};

}  // namespace keel::train

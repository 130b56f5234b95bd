// What a whole training run costs: total FLOPs for a token budget, accelerator-hours at the
// predicted MFU, wall-clock days, money, and what failures add (checkpoint_interval.h).
//
//   auto cost = keel::plan::EstimateCost(job, estimate.time, keel::plan::PlanCheckpoints(job));
//   cost.wall_days + cost.failure_days;  // expected calendar time
#pragma once

#include "keel/plan/checkpoint_interval.h"
#include "keel/plan/comm_time.h"

namespace keel::plan {

struct RunCost {
  double tokens = 0;
  bool default_tokens = false;  // 20 tokens per parameter (Hoffmann et al. 2022, "Chinchilla")
  double total_flops = 0;       // model FLOPs: tokens × (6N + 12Lhs), as MFU counts them
  // Without failures: total FLOPs / (peak × MFU), on all accelerators.
  double accel_hours = 0, wall_days = 0, money = 0;  // money: 0 when no price was given
  // What failures add on top: saves, lost work and restarts, (1/goodput − 1) × the above;
  // infinite when goodput is 0 (failures come faster than the run can save and restart).
  double failure_accel_hours = 0, failure_days = 0, failure_money = 0;
};

RunCost EstimateCost(const Job& job, const StepTime& t, const CheckpointPlan& c);

}  // namespace keel::plan

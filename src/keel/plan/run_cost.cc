// The cost of a run; see run_cost.h.
#include "keel/plan/run_cost.h"

#include <limits>

#include "keel/plan/memory.h"

namespace keel::plan {

RunCost EstimateCost(const Job& job, const StepTime& t, const CheckpointPlan& c) {
  RunCost r;
  const double n = TotalParams(job.model);
  r.default_tokens = job.run.tokens <= 0;
  r.tokens = r.default_tokens ? 20 * n : job.run.tokens;
  r.total_flops = r.tokens * ModelFlopsPerToken(job.model, n);
  const double peak = PeakFlops(job.cluster.accel, job.precision == Precision::kFp32);
  // Accelerator-seconds: every accelerator delivers peak × MFU model FLOP/s.
  const double accel_s = r.total_flops / (peak * t.mfu);
  r.accel_hours = accel_s / 3600;
  r.wall_days = accel_s / job.cluster.world / 86400;
  r.money = r.accel_hours * job.run.price_per_hour;
  const double extra = c.goodput > 0 ? 1 / c.goodput - 1 : std::numeric_limits<double>::infinity();
  r.failure_accel_hours = extra * r.accel_hours;
  r.failure_days = extra * r.wall_days;
  r.failure_money = r.money > 0 ? extra * r.money : 0;
  return r;
}

}  // namespace keel::plan

// The failure and checkpoint model; see checkpoint_interval.h and docs/PLAN.md.
#include "keel/plan/checkpoint_interval.h"

#include <algorithm>
#include <cmath>

#include "keel/plan/memory.h"

namespace keel::plan {

double YoungInterval(double delta_s, double mtbf_s) { return std::sqrt(2 * delta_s * mtbf_s); }

double DalyInterval(double delta_s, double mtbf_s) {
  if (delta_s >= 2 * mtbf_s) return mtbf_s;
  const double x = delta_s / (2 * mtbf_s);
  return YoungInterval(delta_s, mtbf_s) * (1 + std::sqrt(x) / 3 + x / 9) - delta_s;
}

double CheckpointStateBytes(const Job& job) {
  // fp32 runs: the working weights are the master; bf16 runs: the master is written, the bf16 copy
  // rebuilt on resume. Either way 4 + 8 bytes per parameter, of the trained ones (LoRA: the
  // adapters; the frozen base is named, not written).
  return 12 * TrainableParams(job.model);
}

CheckpointPlan PlanCheckpoints(const Job& job) {
  const Cluster& cl = job.cluster;
  const RunInputs& run = job.run;
  CheckpointPlan c;
  c.state_bytes = CheckpointStateBytes(job);
  c.nodes = (cl.world + cl.per_node - 1) / cl.per_node;
  c.storage_bytes_per_s = run.storage_bytes_per_s > 0 ? run.storage_bytes_per_s : 2e9 * c.nodes;
  c.blocking_s = c.state_bytes / cl.world / cl.accel.host_bytes_per_s;
  c.write_s = c.blocking_s + c.state_bytes / c.storage_bytes_per_s;
  c.restart_s = run.restart_s + c.state_bytes / c.storage_bytes_per_s;
  c.job_mtbf_s = run.node_mtbf_hours * 3600 / c.nodes;
  const double delta = c.blocking_s, m = c.job_mtbf_s;
  c.young_s = YoungInterval(delta, m);
  c.daly_s = DalyInterval(delta, m);
  // One save at a time: the next snapshot waits until the previous one is on storage.
  const double lag = c.write_s - c.blocking_s;
  c.interval_s = std::max(c.daly_s, lag);
  c.save_fraction = delta / (c.interval_s + delta);
  c.lost_fraction = ((c.interval_s + delta) / 2 + lag + c.restart_s) / m;
  c.goodput = std::max(0.0, 1 - c.save_fraction - c.lost_fraction);

  c.peer = c.nodes >= 2 && cl.accel.inter_bytes_per_s > 0;
  if (!c.peer) return c;
  const double node_share = c.state_bytes / c.nodes;
  const double nic = cl.accel.inter_bytes_per_s * std::min(cl.per_node, cl.world);
  c.peer_send_s = node_share / nic;
  c.peer_restart_s = run.restart_s + node_share / nic;
  c.peer_interval_s = std::max(DalyInterval(delta, m), c.peer_send_s);
  const double window = c.peer_interval_s + delta + c.peer_send_s + c.peer_restart_s;
  c.peer_uncovered_mtbf_s = m / std::min(1.0, window / (run.node_mtbf_hours * 3600));
  c.peer_shared_interval_s = std::max(DalyInterval(delta, c.peer_uncovered_mtbf_s), lag);
  c.peer_save_fraction =
      delta / (c.peer_interval_s + delta) + delta / (c.peer_shared_interval_s + delta);
  c.peer_lost_fraction =
      ((c.peer_interval_s + delta) / 2 + c.peer_send_s + c.peer_restart_s) / m +
      ((c.peer_shared_interval_s + delta) / 2 + lag + c.restart_s) / c.peer_uncovered_mtbf_s;
  c.peer_goodput = std::max(0.0, 1 - c.peer_save_fraction - c.peer_lost_fraction);
  return c;
}

}  // namespace keel::plan

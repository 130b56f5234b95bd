// The trainer's record of each step: the console line, the metrics.jsonl line, the Prometheus
// gauges and the alerts, from one set of figures. Every rank's step-time breakdown and memory are
// gathered to rank 0 (one small collective per step), which prints, writes, serves and judges
// them.
//
//   StepReporter report(cfg, comm, last_step, lead ? &events : nullptr, checkpoint_dir);
//   ckpt.set_on_commit(report.CommitHook());
//   if (lead) report.LogStart(run, facts);
//   report.Report(figures, extra, lead ? &metrics : nullptr);   // every rank, at the same step
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "keel/monitor/alerts.h"
#include "keel/monitor/eta.h"
#include "keel/monitor/flops.h"
#include "keel/monitor/jsonl.h"
#include "keel/monitor/prometheus_exporter.h"
#include "keel/monitor/step_times.h"
#include "keel/parallel/comm.h"
#include "keel/train/config.h"

namespace keel::train {

struct StepFigures {
  int step = 0;  // 1-based, done
  double loss = 0, lr = 0, grad_norm = 0;
  std::optional<double> val_loss;  // none: no validation this step (NaN: a non-finite one)
  double tokens = 0;               // the step's tokens, all ranks
  double flops = 0;                // the step's model FLOPs, all ranks
  double peak_flops = 0;           // all ranks
  bool skipped = false;
  bool overflow = false;  // skipped as a loss-scale overflow the scaler answered: not a fault
  bool straggler_checked = false;  // the straggler check ran this step
  std::string straggler;           // the line naming one, "" when none
  monitor::StepTimes times;        // this rank's; `other` closed against `ms`
  double ms = 0;                   // this rank's whole loop iteration
};

struct Run;  // run_setup.h

// What the startup log says beside the run itself, measured at setup.
struct RunFacts {
  int threads = 1;                  // this rank's
  monitor::Peak rank_peak;          // rank 0's
  nlohmann::json memory;            // what this rank allocated, by kind
  std::vector<double> stage_bytes;  // each pipeline stage's total
};

class StepReporter {
 public:
  // `events` (rank 0's, else null) receives the alerts; `disk_path` is where checkpoints go;
  // `exporter`: rank 0's Prometheus endpoint when [monitor] metrics_port is set (bound before the
  // run folder is written, so that a port in use is refused first).
  StepReporter(const RunConfig& cfg, parallel::Comm& comm, int last_step,
               monitor::JsonlWriter* events, const std::string& disk_path,
               std::unique_ptr<monitor::MetricsExporter> exporter);
  ~StepReporter();

  // For the checkpointer: a committed save restarts the checkpoint-age alert. Safe to call after
  // this reporter is gone.
  std::function<void()> CommitHook() const;

  // Rank 0, before the first step: what runs where — model, precision, ranks and threads, batch,
  // layout, the peak MFU is measured against, the shards of tensor and pipeline parallelism,
  // memory per rank and stage (also as an event), and the data sources.
  void LogStart(const Run& run, const RunFacts& facts);

  // After the loop: the time rules stop waiting for steps (monitor::Alerts::StepsEnded).
  void StepsEnded() {
    if (alerts_) alerts_->StepsEnded();
  }

  // Collective. `extra` (rank 0's) is merged into the metrics line: layout-specific figures.
  void Report(const StepFigures& f, const nlohmann::json& extra, monitor::JsonlWriter* metrics);

 private:
  void Serve(const StepFigures& f, const std::vector<double>& all, double eta_s);

  const RunConfig& cfg_;
  parallel::Comm& comm_;
  const int last_step_;
  monitor::JsonlWriter* events_;  // rank 0's, else null
  monitor::Eta eta_;
  std::unique_ptr<monitor::MetricsExporter> exporter_;
  std::shared_ptr<monitor::Alerts> alerts_;  // rank 0's; shared with the commit hook
};

}  // namespace keel::train

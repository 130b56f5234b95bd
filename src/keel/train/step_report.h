// The trainer's record of each step: the console line, the metrics.jsonl line and the Prometheus
// gauges, from one set of figures. Every rank's step-time breakdown and memory are gathered to
// rank 0 (one small collective per step), which prints, writes and serves them.
//
//   StepReporter report(cfg, comm, lead ? &metrics : nullptr);
//   report.Report(figures, extra);   // every rank, at the same step
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "keel/monitor/eta.h"
#include "keel/monitor/jsonl.h"
#include "keel/monitor/prometheus_exporter.h"
#include "keel/monitor/step_times.h"
#include "keel/parallel/comm.h"
#include "keel/train/config.h"

namespace keel::train {

struct StepFigures {
  int step = 0;  // 1-based, done
  double loss = 0, lr = 0, grad_norm = 0;
  double val_loss = -1;   // < 0: no validation this step
  double tokens = 0;      // the step's tokens, all ranks
  double flops = 0;       // the step's model FLOPs, all ranks
  double peak_flops = 0;  // all ranks
  bool skipped = false;
  monitor::StepTimes times;  // this rank's; `other` closed against `ms`
  double ms = 0;             // this rank's whole loop iteration
};

class StepReporter {
 public:
  // `metrics`: rank 0's metrics.jsonl (null elsewhere, or when off). Rank 0 opens the Prometheus
  // endpoint when [monitor] metrics_port is set.
  StepReporter(const RunConfig& cfg, parallel::Comm& comm, int last_step);
  ~StepReporter();

  // Collective. `extra` (rank 0's) is merged into the metrics line: layout-specific figures.
  void Report(const StepFigures& f, const nlohmann::json& extra, monitor::JsonlWriter* metrics);

 private:
  void Serve(const StepFigures& f, const std::vector<double>& all, double eta_s);

  const RunConfig& cfg_;
  parallel::Comm& comm_;
  const int last_step_;
  monitor::Eta eta_;
  std::unique_ptr<monitor::MetricsExporter> exporter_;
};

}  // namespace keel::train

// Everything `keel train` sets up before its first step, in the order every rank builds it: the
// input validated and agreed on, the data, the groups, the step, the checkpointer, the resumed
// (or initial) state, the run folder and the reporter. The loop (trainer.cc) and the detectors
// (step_guards.h) read it; nothing here runs a step.
//
//   Run run(cfg, comm);                        // collective; throws keel::Error on bad input
//   if (run.sum.nothing_left) return run.sum;  // a finished run resumed
//   for (int i = run.start_step; ...) { ... run.step->ForwardBackward(...) ... }
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "keel/ckpt/state.h"
#include "keel/core/folder_lock.h"
#include "keel/data/dataset.h"
#include "keel/data/loader.h"
#include "keel/data/prefetcher.h"
#include "keel/model/params.h"
#include "keel/monitor/jsonl.h"
#include "keel/monitor/prometheus_exporter.h"
#include "keel/optim/loss_scaler.h"
#include "keel/optim/schedule.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/groups.h"
#include "keel/train/checkpointing.h"
#include "keel/train/config.h"
#include "keel/train/evaluation.h"
#include "keel/train/run_data.h"
#include "keel/train/shard_check.h"
#include "keel/train/step.h"
#include "keel/train/step_report.h"
#include "keel/train/trainer.h"

namespace keel::train {

// What Run's setup refuses that one process can check alone, for `world` ranks: the config and
// layout, KEEL_FAULT, and (with `open_data`) the datasets against the model. keel launch runs it
// before the supervisor writes anything. Throws keel::Error.
void CheckRunInput(const RunConfig& cfg, int world, bool open_data);

struct Run {
  // Collective over `comm`. Everything that can be wrong with the input is found before the run
  // folder exists and before the first collective of the step: a rank's error reaches every
  // rank (keel::Error on all of them), and ranks that would run different things do not start.
  Run(const RunConfig& cfg, parallel::Comm& comm);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // The data from loader state `st` on: the prefetcher stops, the loader moves, a new one starts.
  void Reposition(const data::LoaderState& st);
  // Moves the data past `n` global batches at the boundary before step `step_i` (a rollback's
  // skipped window, or [resilience] skip_batches).
  void SkipBatches(int step_i, int n);
  // The run's record restarts after step `step`: metrics.jsonl keeps the steps up to it (a
  // resumed or rolled-back run writes the later ones again). Rank 0 only.
  void RestartRecordAt(int step);
  // The validation loss over the plan's windows (collective; every rank gets it).
  double Validate();
  // The state a checkpoint of step `step_done` holds: the tensors, and beside them the config,
  // loader, optimizer, scheduler and the detectors' `guards_state`.
  ckpt::StateView SaveView(int step_done, const nlohmann::json& guards_state);

  const RunConfig& cfg;
  parallel::Comm& comm;
  const bool lead;  // rank 0: logs, writes the run's files

  model::ModelConfig mcfg;
  DType dtype = DType::kBF16;
  parallel::Layout layout;  // dp, tp, pp, zero, sp, stages, micro-batches
  RunData data;
  std::unique_ptr<ShardCheck> shard_check;
  model::ParamLayout params;  // the whole model's parameters (each rank holds a part)
  StepSpec spec;
  parallel::Groups groups;
  std::unique_ptr<TrainStep> step;
  optim::LrSchedule sched;
  monitor::JsonlWriter metrics, events;  // rank 0's
  std::unique_ptr<Checkpointer> ckpt;
  ckpt::StateView state;                     // the checkpointed tensors of this rank
  std::optional<Resumed> resumed;            // the checkpoint the run started from
  std::optional<data::Prefetcher> prefetch;  // owns the loader from the first step on
  std::unique_ptr<StepReporter> report;
  // [loss_scale] kind = "dynamic": the backward's seed is dloss · scale (null: none).
  std::unique_ptr<optim::LossScaler> scaler;
  // The step at which an fp16 run switched to bf16 ([loss_scale] switch_after), carried in every
  // later checkpoint's state as precision_switch; -1: it has not.
  int switched_at = -1;
  FolderLock lock;  // rank 0's: the run folder has one job at a time
  std::unique_ptr<monitor::MetricsExporter> exporter;  // rank 0's, until the reporter takes it

  TrainSummary sum;
  int start_step = 0;
  double tokens_per_step = 0;  // global
  // This step's targets trained on, all ranks (tokens_per_step unless the data has a loss mask):
  // the step's loss is their mean, and `dloss`, the loss gradient's seed, is 1 / scored (a
  // global batch with none trained on counts 1: loss and gradients 0).
  double scored = 0;
  float dloss = 1;  // times the loss scale, with a scaler
  double flops_per_token = 0;
  double peak = 0;          // all ranks' peak FLOP/s (MFU's denominator)
  size_t memory_bytes = 0;  // what this rank allocated
  bool pipelined = false;
  double bubble_predicted = 0;

 private:
  // The checkpoint's state (`resumed`), or the initial weights when Prepare left them for later.
  void ResumeOrInit(bool init_later);
  void SayScheduleChange();
  // MFU's peak, the memory allocated, the reporter and its startup log (collective).
  void MeasureAndLogStart();
};

}  // namespace keel::train

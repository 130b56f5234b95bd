#include "keel/train/step_report.h"

#include <cstdio>
#include <limits>
#include <string>

#include "keel/core/log.h"
#include "keel/monitor/memory_usage.h"

namespace keel::train {
namespace {

// Per rank, gathered: the phases, then the resident memory now and at its peak.
constexpr size_t kRss = monitor::kPhases, kPeakRss = kRss + 1, kPerRank = kPeakRss + 1;

}  // namespace

StepReporter::StepReporter(const RunConfig& cfg, parallel::Comm& comm, int last_step,
                           monitor::JsonlWriter* events, const std::string& disk_path,
                           std::unique_ptr<monitor::MetricsExporter> exporter)
    : cfg_(cfg),
      comm_(comm),
      last_step_(last_step),
      events_(events),
      exporter_(std::move(exporter)) {
  if (comm.rank() != 0) return;
  const AlertsSection& a = cfg.monitor.alerts;
  alerts_ = std::make_shared<monitor::Alerts>(
      monitor::AlertConfig{a.nonfinite, a.loss_ceiling, cfg.optim.warmup_steps, a.throughput_drop,
                           a.no_step_s, a.checkpoint_age_min, a.min_free_disk_gb, disk_path,
                           a.straggler, a.webhook},
      [events](const nlohmann::json& e, const std::string& line) {
        if (events) events->Write(e);
        Log("keel: %s", line.c_str());
      });
}

std::function<void()> StepReporter::CommitHook() const {
  return [weak = std::weak_ptr<monitor::Alerts>(alerts_)] {
    if (auto a = weak.lock()) a->Checkpointed();
  };
}

StepReporter::~StepReporter() = default;

void StepReporter::Report(const StepFigures& f, const nlohmann::json& extra,
                          monitor::JsonlWriter* metrics) {
  const size_t ranks = size_t(comm_.size());
  std::vector<double> all(ranks * kPerRank, std::numeric_limits<double>::lowest());
  double* mine = all.data() + size_t(comm_.rank()) * kPerRank;
  for (size_t i = 0; i < monitor::kPhases; ++i) mine[i] = f.times.ms[i];
  const monitor::Rss rss = monitor::ReadRss();
  mine[kRss] = rss.current;
  mine[kPeakRss] = rss.peak;
  comm_.AllReduceMax(all.data(), all.size());
  eta_.Add(f.ms);
  if (comm_.rank() != 0) return;

  const double tok_s = f.tokens / (f.ms / 1e3);
  const double mfu = f.peak_flops > 0 ? f.flops / (f.ms / 1e3) / f.peak_flops : 0;
  const double eta_s = eta_.SecondsLeft(last_step_ - f.step);
  const bool last = f.step == last_step_;
  if (cfg_.train.log_every > 0 && ((f.step - 1) % cfg_.train.log_every == 0 || last)) {
    std::printf(
        "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | MFU %5.1f%% | %7.1f ms%s%s"
        " | ETA %s\n",
        f.step, cfg_.train.steps, f.loss, f.lr, f.grad_norm, tok_s, 100 * mfu, f.ms,
        f.val_loss ? (" | val " + std::to_string(*f.val_loss).substr(0, 6)).c_str() : "",
        monitor::ShareLine(f.times, f.ms).c_str(), FormatDuration(eta_s).c_str());
    std::fflush(stdout);
  }
  std::vector<double> rss_now(ranks), rss_peak(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    rss_now[r] = all[r * kPerRank + kRss];
    rss_peak[r] = all[r * kPerRank + kPeakRss];
  }
  if (metrics) {
    nlohmann::json m = {{"step", f.step},
                        {"loss", f.loss},
                        {"lr", f.lr},
                        {"grad_norm", f.grad_norm},
                        {"tokens_per_s", tok_s},
                        {"tokens_per_s_per_rank", tok_s / double(ranks)},
                        {"mfu", mfu},
                        {"ms", f.ms},
                        {"eta_s", eta_s},
                        {"rss_bytes", rss_now},
                        {"peak_rss_bytes", rss_peak}};
    for (size_t i = 0; i < monitor::kPhases; ++i)
      m[monitor::PhaseKey(monitor::Phase(i))] = f.times.ms[i];
    if (f.val_loss) m["val_loss"] = *f.val_loss;  // a NaN is written as null
    if (f.skipped) m["skipped"] = true;
    m.update(extra);
    metrics->Write(m);
  }
  if (exporter_) Serve(f, all, eta_s);
  // The training phases' rate: validation passes and saves are not a throughput drop.
  const double train_ms =
      f.ms - f.times[monitor::Phase::kValidation] - f.times[monitor::Phase::kCheckpoint];
  monitor::StepSignals sig;
  sig.step = f.step;
  sig.loss = f.loss;
  sig.grad_norm = f.grad_norm;
  sig.overflow = f.overflow;
  sig.val_loss = f.val_loss;
  sig.tokens_per_s = train_ms > 0 ? f.tokens / (train_ms / 1e3) : 0;
  sig.straggler_checked = f.straggler_checked;
  sig.straggler = f.straggler;
  alerts_->Step(sig);
}

void StepReporter::Serve(const StepFigures& f, const std::vector<double>& all, double eta_s) {
  monitor::MetricsExporter& e = *exporter_;
  const monitor::MetricsExporter::Batch batch(e);
  const double s = f.ms / 1e3;
  e.Gauge("keel_step", "the last step done", f.step);
  e.Gauge("keel_loss", "training loss of the last step", f.loss);
  if (f.val_loss) e.Gauge("keel_val_loss", "the last validation loss", *f.val_loss);
  e.Gauge("keel_learning_rate", "learning rate of the last step", f.lr);
  e.Gauge("keel_grad_norm", "gradient norm of the last step (before clipping)", f.grad_norm);
  e.Gauge("keel_tokens_per_second", "tokens per second, all ranks, last step", f.tokens / s);
  e.Gauge("keel_mfu", "model FLOPs utilization of the last step (0..1)",
          f.peak_flops > 0 ? f.flops / s / f.peak_flops : 0);
  e.Gauge("keel_step_seconds", "wall time of the last step", s);
  e.Gauge("keel_eta_seconds", "time left to the last step at the recent pace", eta_s);
  e.Counter("keel_steps_total", "steps done by this process", 1);
  e.Counter("keel_tokens_total", "tokens trained by this process", f.tokens);
  e.Counter("keel_skipped_steps_total", "steps whose update was skipped", f.skipped ? 1 : 0);
  const size_t ranks = all.size() / kPerRank;
  for (size_t r = 0; r < ranks; ++r) {
    const std::string rank = std::to_string(r);
    const double* v = all.data() + r * kPerRank;
    for (size_t i = 0; i < monitor::kPhases; ++i) {
      const monitor::Labels l = {{"rank", rank}, {"phase", monitor::PhaseName(monitor::Phase(i))}};
      e.Gauge("keel_step_phase_seconds", "the last step's wall time by phase", v[i] / 1e3, l);
      e.Counter("keel_phase_seconds_total", "wall time by phase since the process started",
                v[i] > 0 ? v[i] / 1e3 : 0, l);
    }
    e.Gauge("keel_tokens_per_second_per_rank", "tokens per second per rank, last step",
            f.tokens / s / double(ranks), {{"rank", rank}});
    e.Gauge("keel_rss_bytes", "resident memory", v[kRss], {{"rank", rank}});
    e.Gauge("keel_peak_rss_bytes", "resident memory at its peak", v[kPeakRss], {{"rank", rank}});
  }
}

}  // namespace keel::train

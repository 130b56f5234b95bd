#include "keel/train/step_guards.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "keel/core/error.h"
#include "keel/core/log.h"
#include "keel/core/timer.h"

namespace keel::train {

StepGuards::StepGuards(Run& run, resilience::HeartbeatWriter& heartbeat)
    : run_(run),
      heartbeat_(heartbeat),
      rs_(run.cfg.resilience),
      // Faults to inject (KEEL_FAULT), fired once per run: the markers live in the run folder.
      faults_(resilience::FaultInjector::FromEnv(run.comm.rank())),
      rollbacks_(run.sum.run_dir + "/rollbacks.json",
                 SharedRollbackFile(run.comm, run.sum.run_dir + "/rollbacks.json"),
                 *ParseSkipBatches(rs_.skip_batches)),
      judge_(rs_),
      stragglers_(rs_.straggler_ratio, rs_.straggler_checks) {
  faults_.SetMarkerDir(run.sum.run_dir + "/faults");
  if (run.resumed) Restore(run.resumed->state);
  hosts_ = GatherHosts(run.comm);
  dp_world_ranks_ = GatherPerRank(*run.groups.dp, run.comm.rank());
  const int dp = run.layout.replicas(), zero = run.layout.zero;
  const bool diloco = run.step->diloco() != nullptr;
  sdc_on_ = rs_.sdc_every > 0 && dp > 1 && !diloco && CanCompareReplicas(*run.step, zero);
  if (run.lead && rs_.sdc_every > 0 && dp > 1 && !sdc_on_)
    Log("keel: [resilience] sdc_every: %s; the silent-corruption check is off",
        diloco ? "DiLoCo's replicas differ between outer steps, by design"
               : ("ZeRO " + std::to_string(zero) + " keeps no replica of the weights to compare")
                     .c_str());
  const char* beat_dir = std::getenv("KEEL_HEARTBEAT_DIR");
  watchdog_.emplace(rs_.hang_timeout_s, beat_dir ? beat_dir : "", run.comm.rank(),
                    [this](const std::string& line, bool self) {
                      if (self) heartbeat_.BlameSelf();
                      Log("keel: %s; exiting 75 so that keel launch restarts the job",
                          line.c_str());
                      heartbeat_.Finish(int(ExitCode::kTempFail), line);
                      std::fflush(nullptr);
                      std::_Exit(int(ExitCode::kTempFail));
                    });
  heartbeat_.StartedAt(run.start_step);
}

StepGuards::~StepGuards() = default;

void StepGuards::HangIfDue(const char* phase, int done) {
  heartbeat_.Set(done, phase);
  if (!faults_.Take(resilience::FaultKind::kHang, step_i_, phase)) return;
  Log("keel: injected fault: rank %d hangs in step %d, phase %s", run_.comm.rank(), step_i_ + 1,
      phase);
  for (;;) pause();
}

void StepGuards::BeforeStep(int step_i) {
  step_i_ = step_i;
  if (const int n = rollbacks_.SkipAt(step_i)) run_.SkipBatches(step_i, n);
  watchdog_->Arm(step_i);
  HangIfDue("data", step_i);
  HangIfDue("forward", step_i);
  spike_fault_ = faults_.Take(resilience::FaultKind::kSpike, step_i) != nullptr;
  nan_fault_ = faults_.Take(resilience::FaultKind::kNanGrad, step_i) != nullptr;
  if (spike_fault_ || nan_fault_)
    Log("keel: injected fault: rank %d, step %d: %s", run_.comm.rank(), step_i + 1,
        spike_fault_ ? "a corrupted batch (targets spread over the vocabulary)" : "NaN gradients");
  sdc_step_ = sdc_on_ && (step_i + 1) % rs_.sdc_every == 0;
  kept_.clear();
}

NextBatch StepGuards::Batches(const NextBatch& next) {
  if (!spike_fault_ && !sdc_step_) return next;
  const size_t rows = size_t(run_.layout.micro_batch) * size_t(run_.cfg.data.seq_len);
  return [this, next, rows](int32_t* tok, int32_t* tgt) {
    const double waited = next(tok, tgt);
    if (spike_fault_)  // garbage: targets spread over the whole vocabulary
      for (size_t i = 0; i < rows; ++i)
        tgt[i] = int32_t((i * 2654435761u + size_t(step_i_)) % size_t(run_.mcfg.vocab_size));
    if (sdc_step_)
      kept_.insert(kept_.end(), tok, tok + rows), kept_.insert(kept_.end(), tgt, tgt + rows);
    return waited;
  };
}

void StepGuards::RerunKept(double* loss) {
  // After the repair: a persistent fault strikes again, and the step is re-run on its own data.
  if (const auto* f = faults_.Repeat(resilience::FaultKind::kBitflip, step_i_))
    FlipBit(*run_.step, *f, run_.comm.rank());
  const size_t rows = size_t(run_.layout.micro_batch) * size_t(run_.cfg.data.seq_len);
  size_t at = 0;
  auto replay = [&](int32_t* tok, int32_t* tgt) {  // host: token ids
    std::copy_n(kept_.data() + at, rows, tok);
    std::copy_n(kept_.data() + at + rows, rows, tgt);
    at += 2 * rows;
    return 0.0;
  };
  *loss = run_.step->ForwardBackward(run_.layout.n_micro, replay, run_.dloss) / run_.scored;
}

double StepGuards::AfterBackward(double* loss, double* compute_ms) {
  if (const resilience::Fault* slow = faults_.Take(resilience::FaultKind::kSlow, step_i_)) {
    const double extra = (slow->factor - 1) * *compute_ms;
    usleep(useconds_t(extra * 1e3));
    *compute_ms += extra;
  }
  compute_since_ += *compute_ms;
  HangIfDue("backward", step_i_);
  const Timer checks;
  if (sdc_step_) {
    const ReplicaCheck check{*run_.step,
                             *run_.groups.dp,
                             run_.layout.zero,
                             run_.comm.rank(),
                             dp_world_ranks_,
                             hosts_,
                             run_.lead ? &run_.events : nullptr};
    CheckReplicas(
        check, step_i_ + 1, [&] { RerunKept(loss); }, [&] { heartbeat_.BlameSelf(); });
  }
  const double ms = checks.Millis();
  HangIfDue("optimizer", step_i_);
  return ms;
}

StepGuards::Verdict StepGuards::Decide(double loss, double norm) {
  if (faults_.Take(resilience::FaultKind::kKill, step_i_)) {
    Log("keel: injected fault: rank %d is killed in step %d", run_.comm.rank(), step_i_ + 1);
    std::fflush(nullptr);
    std::raise(SIGKILL);
  }
  const int step = step_i_ + 1;
  const StepJudge::Verdict verdict = judge_.Judge(loss, norm);
  if (verdict.nonfinite && rs_.stop_on_nonfinite)
    ThrowRuntime("step " + std::to_string(step) + ": the loss is " + std::to_string(loss) +
                 " and the gradient norm " + std::to_string(norm) +
                 "; stopping ([resilience] stop_on_nonfinite = true)");
  if (verdict.nonfinite && run_.lead) {
    Log("keel: step %d: the loss is %g and the gradient norm %g; the update is skipped on "
        "every rank (%d in a row)",
        step, loss, norm, verdict.in_a_row);
    run_.events.Write({{"event", "nonfinite_skip"},
                       {"step", step},
                       {"in_a_row", verdict.in_a_row},
                       {"loss_finite", std::isfinite(loss)}});
  }
  if (verdict.spike && !verdict.rollback && run_.lead) {
    Log("keel: step %d: %s ([resilience] rollback = false: training on)", step,
        verdict.spike->c_str());
    run_.events.Write({{"event", "spike"}, {"step", step}, {"why", *verdict.spike}});
  }
  Verdict v;
  v.apply = !verdict.nonfinite && !verdict.rollback;
  if (verdict.rollback) {
    v.resume_at = RollBack(*verdict.rollback);
    if (v.resume_at < 0) judge_.NoRollback();
  }
  return v;
}

int StepGuards::RollBack(const std::string& why) {
  const int spike_step = step_i_;
  const int recent = rollbacks_.RecentRollbacks(spike_step + 1, rs_.rollback_window);
  if (recent >= rs_.max_rollbacks)
    ThrowRuntime("step " + std::to_string(spike_step + 1) + ": " + why + "; " +
                 std::to_string(recent) + " rollback(s) within the last " +
                 std::to_string(rs_.rollback_window) + " steps already ([resilience] " +
                 "max_rollbacks = " + std::to_string(rs_.max_rollbacks) +
                 "): stopping; the data or the learning rate needs a look (RUN/rollbacks.json)");
  watchdog_->Disarm();
  heartbeat_.Set(spike_step, "resume");
  const data::LoaderState now = run_.prefetch->state();
  std::optional<Resumed> r = run_.ckpt->RollBack(run_.state, spike_step);
  if (!r) {  // nothing to return to: this step's update is skipped instead, the data kept
    if (run_.lead) {
      Log("keel: step %d: %s; no committed checkpoint to roll back to: the update is skipped "
          "(save more often: [checkpoint] every_steps)",
          spike_step + 1, why.c_str());
      run_.events.Write({{"event", "spike_skip"}, {"step", spike_step + 1}, {"why", why}});
    }
    return -1;
  }
  const int to = int(r->step);
  run_.step->Restored(r->state.at("optimizer").at("step").get<int>(), to, r->own_missing);
  const data::LoaderState then = data::LoaderStateFromJson(r->state.at("loader"));
  const int batches = int((now.position - then.position) / uint64_t(run_.cfg.train.batch_size));
  rollbacks_.Record(spike_step + 1, to, batches, why, run_.lead);
  run_.Reposition(then);  // the loop's skip at `to` moves past the window
  Restore(r->state);
  if (run_.lead) {
    Log("keel: step %d: %s; rolled back to step %d and skipping the %d batch(es) from there "
        "through step %d",
        spike_step + 1, why.c_str(), to, batches, spike_step + 1);
    run_.events.Write({{"event", "rollback"},
                       {"spike_step", spike_step + 1},
                       {"to_step", to},
                       {"skipped_batches", batches},
                       {"why", why}});
    run_.RestartRecordAt(to);
  }
  run_.sum.steps_done = to;
  return to;
}

void StepGuards::AfterUpdate(bool applied, double loss, double norm) {
  if (applied) judge_.Applied(loss, norm);
  if (const resilience::Fault* f = faults_.Take(resilience::FaultKind::kBitflip, step_i_))
    FlipBit(*run_.step, *f, run_.comm.rank());
}

void StepGuards::AfterStep(double loss, StepFigures* fig, nlohmann::json* extra) {
  heartbeat_.StepDone(step_i_ + 1);
  const std::vector<double> scores = CheckStragglers(
      stragglers_, run_.comm, compute_since_, run_.groups.at.pp, step_i_ + 1, rs_, hosts_,
      run_.lead ? &run_.events : nullptr, [&] { heartbeat_.BlameSelf(); }, &fig->straggler);
  if (!scores.empty()) {
    compute_since_ = 0;
    fig->straggler_checked = true;
    (*extra)["straggler_scores"] = scores;
  }
  recent_losses_.push_back(loss);
  if (recent_losses_.size() > 64) recent_losses_.erase(recent_losses_.begin());
}

void StepGuards::BeforeSave() {
  if (faults_.Take(resilience::FaultKind::kSigterm, step_i_)) {
    Log("keel: injected fault: SIGTERM to rank %d after step %d", run_.comm.rank(), step_i_ + 1);
    std::raise(SIGTERM);
  }
  HangIfDue("checkpoint", step_i_ + 1);
}

void StepGuards::Finish(int steps_done) {
  if (watchdog_) watchdog_->Disarm();
  heartbeat_.Set(steps_done, "final");
}

nlohmann::json StepGuards::State() const {
  return {{"resilience", judge_.ToJson()}, {"metrics", {{"recent_losses", recent_losses_}}}};
}

std::vector<double> RecentLossesFromJson(const nlohmann::json& j) {
  std::vector<double> losses;
  for (const nlohmann::json& v : j.get_ref<const nlohmann::json::array_t&>())
    losses.push_back(v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>());
  return losses;
}

void StepGuards::Restore(const nlohmann::json& st) {
  recent_losses_ = RecentLossesFromJson(st.at("metrics").at("recent_losses"));
  judge_.FromJson(st.value("resilience", nlohmann::json::object()));
}

}  // namespace keel::train

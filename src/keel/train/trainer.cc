// `keel train`: the run's setup (run_setup.h), then the loop, which reads top to bottom as one
// step does — the batch, the guards, forward and backward, the verdict, the update, the record,
// the save — and the end of the run (the model file, samples, the last save).
#include "keel/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "keel/ckpt/manifest.h"
#include "keel/ckpt/model_file.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/log.h"
#include "keel/core/stop_signal.h"
#include "keel/core/timer.h"
#include "keel/resilience/heartbeat.h"
#include "keel/train/rank_agreement.h"
#include "keel/train/run_setup.h"
#include "keel/train/samples.h"
#include "keel/train/step_guards.h"
#include "keel/train/step_report.h"

namespace keel::train {
namespace {

using monitor::Phase;

// Forward and backward over the step's micro-batches, with the phases they took in `times`.
// Returns the step's mean loss; `compute_ms` gets the compute (the waits for data and for
// other ranks left out).
double ForwardBackward(Run& run, StepGuards& guards, monitor::StepTimes* times,
                       double* compute_ms) {
  TrainStep& step = *run.step;
  const Timer timer;
  // The loss is the mean over the targets trained on: all of them, or a loss mask's.
  uint64_t scored = 0;
  const double scored_ms = run.prefetch->StepScored(&scored);
  run.scored = double(std::max<uint64_t>(scored, 1));
  run.dloss = float((run.scaler ? run.scaler->scale() : 1.0) / run.scored);
  double data_ms = 0;
  const NextBatch next =
      guards.Batches([&run](int32_t* tok, int32_t* tgt) { return run.prefetch->Next(tok, tgt); });
  const double loss =
      step.ForwardBackward(run.layout.n_micro, next, guards.dloss(run.dloss), &data_ms) /
      run.scored;
  data_ms += scored_ms;
  // Waiting for other stages is the pipeline's bubble; the backward phase is what the forward
  // and the waits leave of the pass (zeroing and accumulating the gradients included).
  (*times)[Phase::kData] = data_ms;
  (*times)[Phase::kForward] = step.forward_ms();
  (*times)[Phase::kHead] = step.head_ms();
  (*times)[Phase::kCommDp] = step.dp_wait_ms();
  (*times)[Phase::kCommTp] = step.tp_wait_ms();
  (*times)[Phase::kCommCp] = step.cp_wait_ms();
  (*times)[Phase::kCommPp] = step.pp_wait_ms();
  (*times)[Phase::kCommTied] = step.tied_wait_ms();
  const double backward_wait_ms = step.comm_wait_ms() + step.pp_wait_ms();
  *compute_ms = std::max(0.0, timer.Millis() - data_ms - backward_wait_ms);
  return loss;
}

// Clipping and AdamW unless the guards said skip, once a save in flight has its snapshot.
// `timer` started with the optimizer phase (the norm, the verdict).
// `norm` is the unscaled gradients'; `scale` the loss scale they carry.
void Update(Run& run, bool apply, float lr, double norm, double scale, const Timer& timer,
            monitor::StepTimes* times, nlohmann::json* extra) {
  const double ckpt_ms = run.ckpt->BeforeUpdate();
  const double dp_before = run.step->dp_wait_ms();
  if (apply) run.step->Apply(lr, run.cfg.optim.grad_clip, norm, 1.0 / scale);
  const double dp_in_update = run.step->dp_wait_ms() - dp_before;  // ZeRO's all-gathers
  (*times)[Phase::kOptimizer] = timer.Millis() - ckpt_ms - dp_in_update;
  (*times)[Phase::kCheckpoint] = ckpt_ms;
  (*times)[Phase::kCommDp] += dp_in_update;
  if (ckpt_ms > 0) (*extra)["ckpt_blocked_ms"] = ckpt_ms;
}

// Whether the scaler can still answer an overflow: back off, or (an fp16 run at the minimum)
// count toward [loss_scale] switch_after. Every rank sees the same scaler.
bool ScalerCanAct(const Run& run) {
  return !run.scaler->at_minimum() ||
         (run.dtype == DType::kF16 && run.cfg.loss_scale.switch_after > 0);
}

// The loss scaler's part of step `step` (1-based): its new scale, the overflow's event, and a
// line when overflows persist at the minimum scale. `judged`: the step's fate was the non-finite
// guard's (StepGuards::Decide), not the scaler's.
void ScaleAfterStep(Run& run, int step, bool overflow, bool judged, nlohmann::json* extra) {
  optim::LossScaler& s = *run.scaler;
  const double before = s.scale();
  s.Update(overflow);
  (*extra)["loss_scale"] = before;
  if (!overflow || !run.lead) return;
  run.events.Write({{"event", "loss_scale_overflow"},
                    {"step", step},
                    {"scale", before},
                    {"next_scale", s.scale()}});
  const int at_min = s.state().steps_at_minimum;
  if (at_min > 0 && (at_min & (at_min - 1)) == 0) {  // 1, 2, 4, 8, ... in a row
    Log("keel: step %d: the gradients overflowed at the minimum loss scale %g (%d step(s) in a "
        "row); %s",
        step, s.scale(), at_min,
        judged ? "the scaler can do no more: the non-finite guard judges the step ([resilience])"
               : "the update is skipped and the run goes on");
    run.events.Write({{"event", "loss_scale_at_minimum"}, {"step", step}, {"in_a_row", at_min}});
  }
}

// fp8 runs: the step's amaxes judged (TrainStep::Fp8EndStep). A block that falls back runs in
// bf16 from the next step on, with a line and an event; the step's metrics count the blocks left.
void Fp8AfterStep(Run& run, int step, nlohmann::json* extra) {
  if (!run.mcfg.fp8) return;
  // Rank 0 says what its stage's blocks did (the replicas judged the same amaxes); other stages'
  // fallbacks show in the count.
  for (const std::string& why : run.step->Fp8EndStep()) {
    if (!run.lead) continue;
    Log("keel: step %d: fp8 %s; the block runs in bf16 from here on", step, why.c_str());
    run.events.Write({{"event", "fp8_fallback"}, {"step", step}, {"why", why}});
  }
  (*extra)["fp8_blocks"] = run.step->fp8_blocks();
}

// Whether an fp16 run switches to bf16 after step `step` ([loss_scale] switch_after overflows in a
// row at the minimum scale): every rank sees the same scaler, so all decide alike.
bool SwitchesNow(Run& run, int step) {
  const int after = run.cfg.loss_scale.switch_after;
  if (run.dtype != DType::kF16 || !run.scaler || after <= 0 ||
      run.scaler->state().steps_at_minimum < after)
    return false;
  run.switched_at = step;
  if (run.lead) {
    Log("keel: step %d: %d overflows in a row at the minimum loss scale %g; switching to bf16 "
        "(saving a checkpoint and resuming from it)",
        step, run.scaler->state().steps_at_minimum, run.scaler->scale());
    run.events.Write({{"event", "precision_switch"},
                      {"step", step},
                      {"from", "fp16"},
                      {"to", "bf16"},
                      {"overflows_at_minimum", run.scaler->state().steps_at_minimum}});
  }
  return true;
}

// After step `done`: the ranks agree on saving and stopping (a data error found by the shard
// check stops every rank alike), and a save begins when one is due.
StepDecision Save(Run& run, StepGuards& guards, int done, bool last_step, bool stop_requested,
                  double step_ms, std::optional<Error>* data_error, monitor::StepTimes* times,
                  nlohmann::json* extra, bool must_save = false) {
  try {
    run.shard_check->ThrowIfFailed();
  } catch (const Error& e) {
    *data_error = e;
  }
  guards.BeforeSave();
  const double overlap_ms = run.ckpt->NoteStep(step_ms);
  if (overlap_ms >= 0) (*extra)["save_overlap_ms"] = overlap_ms;
  const Timer timer;
  const StepDecision decision = run.ckpt->AfterStep(
      done, last_step, stop_requested, data_error->has_value(),
      [&] { return run.SaveView(done, guards.State()); }, must_save);
  (*times)[Phase::kSync] = decision.agree_ms;
  (*times)[Phase::kCheckpoint] += timer.Millis() - decision.agree_ms;
  guards.Phase(done, "train");
  return decision;
}

// The end of a run: every rank takes part in gathering the weights; rank 0 writes them and
// prints samples. Then the last save completes, and the run's record is checked.
void Finish(Run& run) {
  const RunConfig& cfg = run.cfg;
  TrainSummary& sum = run.sum;
  // A run switching precision goes on from its checkpoint (Train): nothing final here.
  const bool need_weights = !sum.switched && (cfg.checkpoint.save_final ||
                                              (!sum.interrupted && cfg.train.sample_count > 0));
  std::vector<float> final_w = need_weights ? run.step->GatherWeights() : std::vector<float>();
  // The model file holds the weights a model without adapters uses: LoRA's merged into them.
  const model::ModelConfig base = model::BaseModel(run.mcfg);
  const model::ParamLayout base_params = model::ParamLayout::Whole(base);
  if (run.mcfg.lora_rank > 0 && need_weights && run.lead)
    model::MergeLoraInPlace(run.mcfg, final_w);
  if (run.lead && cfg.checkpoint.save_final && need_weights)
    ckpt::WriteModel(sum.run_dir + "/model.safetensors", base, base_params, final_w.data());
  if (run.lead && !sum.interrupted && need_weights)
    PrintSamples(cfg, base, base_params, final_w.data(),
                 run.data.train_ds.empty() ? nullptr : run.data.train_ds.front().meta());
  run.ckpt->Finish();  // after the model file: a failed last save must not cost the weights too
  if (const optim::OffloadTier* t = run.step->store().tier(); t && !t->host() && run.lead) {
    // What the tier cost: its traffic, its bandwidth while busy, and the update's wait for it.
    const optim::TierStats st = t->stats();
    Log("keel: offload tier: read %.2f GiB, wrote %.2f GiB in %.1f s of I/O (%.2f GB/s); the "
        "update waited %.1f s for it",
        st.read_bytes / 1073741824.0, st.written_bytes / 1073741824.0, st.io_ms / 1000,
        st.io_ms > 0 ? (st.read_bytes + st.written_bytes) / (st.io_ms * 1e6) : 0.0,
        st.wait_ms / 1000);
  }
  // Lines of metrics or events that could not be written: the run's record is incomplete.
  std::string lost;
  for (const monitor::JsonlWriter* w : {&run.metrics, &run.events})
    if (w->failed_lines() > 0)
      lost += (lost.empty() ? "" : "; ") + std::to_string(w->failed_lines()) + " line(s) of " +
              w->path() + " (" + w->failure() + ")";
  if (!lost.empty())
    ThrowRuntime("the run trained to step " + std::to_string(sum.steps_done) +
                 " but its outputs are incomplete: could not write " + lost);
}

TrainSummary TrainRun(const RunConfig& cfg, parallel::Comm& comm,
                      resilience::HeartbeatWriter& heartbeat) {
  Run run(cfg, comm);
  TrainSummary& sum = run.sum;
  if (sum.nothing_left) {
    // A finished run: nothing is trained, saved or rewritten. The heartbeat says where the run
    // stands, so that a supervisor whose earlier start already reached the end reports that step.
    heartbeat.Set(run.start_step, "done");
    return sum;
  }
  StepGuards guards(run, heartbeat);
  TrainStep& step = *run.step;
  StopScope stop;  // SIGINT/SIGTERM/SIGUSR2 from here on: finish the step, save, exit 0
  for (int i = run.start_step; i < cfg.train.steps; ++i) {
    const Timer step_timer;
    StepFigures fig;
    nlohmann::json extra;
    guards.BeforeStep(i);
    step.SetStepIndex(i);
    double compute_ms = 0;
    double loss = ForwardBackward(run, guards, &fig.times, &compute_ms);
    // The bubble as the last stage measured it, and the slowest stage's wait, for rank 0's log.
    double pipe[2] = {step.last_stage() ? step.bubble() : 0.0, step.pp_wait_ms()};
    if (run.pipelined) comm.AllReduceMax(pipe, 2);
    fig.times[Phase::kChecks] = guards.AfterBackward(&loss, &compute_ms);
    fig.times[Phase::kBackward] = compute_ms - fig.times[Phase::kForward] - fig.times[Phase::kHead];
    const Timer optimizer_timer;
    const float lr = run.sched.At(i);
    const double scale = run.scaler ? run.scaler->scale() : 1.0;
    const double own_norm = step.GradNorm() / scale;  // what this rank clips by
    const double norm = step.JudgedNorm(own_norm);    // the same on every rank
    // Non-finite gradients of a finite loss under loss scaling are the scaler's overflow while it
    // can act (back off, or switch fp16 to bf16): the step is skipped and the judge does not count
    // it as a fault. Past that, they are the judge's like any non-finite step.
    const bool overflow =
        run.scaler && std::isfinite(loss) && !std::isfinite(norm) && ScalerCanAct(run);
    StepGuards::Verdict verdict;
    verdict.apply = false;
    if (!overflow) verdict = guards.Decide(loss, norm);
    if (verdict.resume_at >= 0) {  // rolled back: on from the checkpoint's step
      i = verdict.resume_at - 1;
      continue;
    }
    if (run.scaler) {
      // A step the judge skipped is an overflow to the scaler too (as Megatron-LM's found_inf):
      // counted as clean, it would grow the scale and reset the count toward fp16's switch.
      const bool nonfinite = !std::isfinite(loss) || !std::isfinite(norm);
      ScaleAfterStep(run, i + 1, nonfinite, /*judged=*/!overflow, &extra);
      if (nonfinite || run.scaler->scale() != scale) step.strategy().ResetResidual();
    }
    const bool switching = SwitchesNow(run, i + 1);
    Update(run, verdict.apply, lr, own_norm, scale, optimizer_timer, &fig.times, &extra);
    Fp8AfterStep(run, i + 1, &extra);
    if (OuterLoop* outer = step.diloco()) {
      // DiLoCo's rounds (or fragments' rounds) end, land or travel (its time is dp's).
      const Timer outer_timer;
      double wait_ms = 0;
      if (outer->Advance(i + 1, i + 1 == cfg.train.steps, &wait_ms)) {
        extra["diloco_wait_ms"] = wait_ms;
        extra["diloco_bytes"] = outer->sent_bytes();
        fig.times[Phase::kCommDp] += outer_timer.Millis();
      }
    }
    guards.AfterUpdate(verdict.apply, loss, norm);
    sum.steps_done = i + 1;
    sum.last_loss = loss;
    const Timer checks_timer;
    guards.AfterStep(loss, &fig, &extra);
    fig.times[Phase::kChecks] += checks_timer.Millis();
    const bool last_step = i + 1 == cfg.train.steps || i + 1 == cfg.train.stop_at;
    if (run.data.val_plan &&
        ((cfg.train.val_every > 0 && (i + 1) % cfg.train.val_every == 0) || last_step)) {
      guards.Phase(i + 1, "validate");
      const Timer val_timer;
      fig.val_loss = sum.val_loss = run.Validate();
      fig.times[Phase::kValidation] = val_timer.Millis();
      guards.Phase(i + 1, "train");
    }
    std::optional<Error> data_error;
    const StepDecision decision =
        Save(run, guards, i + 1, last_step, stop.requested(), step_timer.Millis(), &data_error,
             &fig.times, &extra, /*must_save=*/switching);
    // What the step computed in, for runs that may switch or have.
    if (cfg.train.precision == "fp16" || run.switched_at >= 0)
      extra["precision"] = DTypeName(run.dtype);

    fig.step = i + 1;
    fig.loss = loss;
    fig.lr = lr;
    fig.grad_norm = norm;
    fig.tokens = run.tokens_per_step;
    fig.flops = run.flops_per_token * run.tokens_per_step;
    fig.peak_flops = run.peak;
    fig.skipped = !verdict.apply;
    fig.overflow = overflow;
    fig.ms = step_timer.Millis();
    fig.times.CloseWith(fig.ms);
    extra.update({{"comm_wait_ms", step.comm_wait_ms()},
                  {"comm_bytes", step.comm_bytes()},
                  {"grad_comm_bytes", step.grad_comm_bytes()},
                  {"compute_ms", compute_ms},
                  {"memory_bytes", run.memory_bytes}});
    if (run.scored != run.tokens_per_step) extra["scored_tokens"] = run.scored;
    if (run.pipelined)
      extra.update({{"pp_wait_max_ms", pipe[1]},
                    {"bubble", pipe[0]},
                    {"bubble_predicted", run.bubble_predicted}});
    run.report->Report(fig, extra, run.lead && run.metrics.is_open() ? &run.metrics : nullptr);
    if (decision.failed) ShareError(comm, data_error);  // throws on every rank
    if (switching) {  // Train() resumes from the checkpoint just written, in bf16
      sum.switched = true;
      break;
    }
    if (decision.stop) {
      sum.interrupted = true;
      if (run.lead) Log("keel: interrupted at step %d", i + 1);
      break;
    }
    if (i + 1 == cfg.train.stop_at) {  // stop_at > start_step, checked at resume
      if (run.lead) Log("keel: stopping at step %d ([train] stop_at)", i + 1);
      break;
    }
  }
  run.report->StepsEnded();
  guards.Finish(sum.steps_done);
  Finish(run);
  return sum;
}

// A run that switched from fp16 to bf16 stays in bf16 when it resumes, whatever its config says:
// the checkpoint it resumes from (the newest, or the one named) records the switch.
RunConfig StaysSwitched(const RunConfig& cfg, bool lead) {
  if (cfg.train.precision != "fp16") return cfg;
  const std::string run_dir = (std::filesystem::path(cfg.train.out_dir) / cfg.train.name).string();
  const auto candidates = ResumeCandidates(cfg.checkpoint.resume, CheckpointRootOf(cfg, run_dir));
  if (candidates.empty()) return cfg;
  const std::string& dir = candidates.front();
  nlohmann::json state;
  try {
    state = ckpt::ManifestFromJsonText(ReadWholeFile(dir + "/manifest.json"), dir).state;
  } catch (const std::exception&) {
    return cfg;  // the resume itself says what is wrong with it
  }
  if (!state.contains("precision_switch")) return cfg;
  RunConfig c = cfg;
  c.train.precision = "bf16";
  if (lead)
    Log("keel: the run switched from fp16 to bf16 at step %d (%s says so); it goes on in bf16",
        state["precision_switch"].value("step", 0), dir.c_str());
  return c;
}

}  // namespace

TrainSummary Train(const RunConfig& cfg, parallel::Comm& comm) {
  // Under keel launch each rank beats into the folder the supervisor named, which watches it;
  // a run started by hand writes none.
  const char* dir = std::getenv("KEEL_HEARTBEAT_DIR");
  resilience::HeartbeatWriter heartbeat(dir ? dir : "", comm.rank(),
                                        dir && *dir ? cfg.launch.heartbeat_s : 0);
  try {
    RunConfig run_cfg = StaysSwitched(cfg, comm.rank() == 0);
    TrainSummary s = TrainRun(run_cfg, comm, heartbeat);
    if (s.switched) {
      // From the checkpoint the switch wrote, in bf16 (a scaler of kind "auto" goes with fp16).
      run_cfg.train.precision = "bf16";
      run_cfg.checkpoint.resume = "auto";
      const int switched_at = s.steps_done;
      s = TrainRun(run_cfg, comm, heartbeat);
      s.switched = switched_at > 0;
    }
    heartbeat.Finish(0, "");
    return s;
  } catch (const Error& e) {
    heartbeat.Finish(int(e.code()), e.what());
    throw;
  } catch (const std::exception& e) {
    heartbeat.Finish(int(ExitCode::kRuntime), e.what());
    throw;
  }
}

}  // namespace keel::train

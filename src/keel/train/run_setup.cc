// Setup of a training run (run_setup.h): what every rank builds, in one order, before step 1.
#include "keel/train/run_setup.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "keel/ckpt/checkpoint_model.h"
#include "keel/ckpt/model_file.h"
#include "keel/ckpt/model_source.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/log.h"
#include "keel/core/validate.h"
#include "keel/data/dataset_meta.h"
#include "keel/kernels/cpu_isa.h"
#include "keel/model/quantize.h"
#include "keel/monitor/flops.h"
#include "keel/parallel/comm_wait.h"
#include "keel/parallel/pipeline_schedule.h"
#include "keel/resilience/build_id.h"
#include "keel/resilience/fault_inject.h"
#include "keel/train/freeze.h"
#include "keel/train/memory_check.h"
#include "keel/train/rank_agreement.h"
#include "keel/train/saved_layout.h"

namespace keel::train {
namespace {

// Rewrites metrics.jsonl with only the steps <= `step` (a resumed run writes the later ones
// again). Written to a new file and renamed, so a crash leaves the old or the new, never a mix.
void KeepMetricsUpTo(const std::string& path, int step) {
  if (step == 0 || !std::filesystem::exists(path)) {
    std::filesystem::remove(path);
    return;
  }
  std::ifstream in(path);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("step", 0) <= step) kept += line + "\n";
  }
  WriteFileAtomic(path, kept);
}

struct Setup {
  model::ModelConfig mcfg;
  DType dtype;
  parallel::Layout layout;  // dp, tp, pp, zero, sp, stages, micro_batch, n_micro
};

Setup Validate(const RunConfig& cfg, int world) {
  Setup s;
  s.layout = ResolveLayout(cfg, world);
  s.mcfg = cfg.ResolvedModel();
  // fp8 block products are a training setting the model carries (ModelConfig::fp8).
  s.mcfg.fp8 = cfg.train.precision == "fp8";
  s.mcfg.fp8_recipe = {cfg.train.fp8_recipe == "delayed", cfg.train.fp8_amax_history,
                       double(cfg.train.fp8_spike)};
  const TrainSection& t = cfg.train;
  s.dtype = t.precision == "fp32"   ? DType::kF32
            : t.precision == "fp16" ? DType::kF16
                                    : DType::kBF16;
  if (cfg.data.train.empty() && cfg.data.sources.empty())
    ThrowBadInput("[data] train: expected a dataset path (or [[data.sources]]), got nothing");
  if (const std::string why = model::TpQuantProblem(s.mcfg, s.layout.tp); !why.empty())
    ThrowBadInput("[lora] base = \"" + cfg.lora.base + "\": " + why +
                  " (parallel.tp); use base = \"int8\" or a smaller tp");
  // A LoRA run's state is its adapters' (optim::ParamStore's compact state): their gradients
  // are a few MB, not worth sharding; ZeRO 3 shards the frozen base.
  if (s.mcfg.lora_rank > 0 && s.layout.zero == 2)
    ThrowBadInput(
        "[parallel] zero = 2: a LoRA run's gradients are its adapters' alone (a few MB); use "
        "zero = 1 to shard their master and moments, or 3 to shard the frozen base as well");
  if (s.mcfg.lora_rank > 0 && !cfg.optim.freeze.empty())
    ThrowBadInput(
        "[optim] freeze: a LoRA run freezes everything but its adapters already; "
        "leave freeze empty");
  CheckMemoryFits(cfg, s.layout);  // before anything large is allocated
  return s;
}

// KEEL_FAULT, parsed and checked against this job before anything is written: a drill that
// would silently do nothing is refused.
void CheckFaultSpec(const RunConfig& cfg, const model::ModelConfig& mcfg, int world) {
  if (const char* faults = std::getenv("KEEL_FAULT"); faults && *faults) {
    const model::ParamLayout whole = model::ParamLayout::Whole(mcfg);
    resilience::CheckFaultsStrike(
        resilience::ParseFaults(faults), world, cfg.train.steps,
        [&whole](const resilience::Fault& f) -> std::string {
          for (const model::ParamInfo& q : whole.params())
            if (q.name == f.param)
              return f.index < q.numel ? ""
                                       : "index " + std::to_string(f.index) + " is past its " +
                                             std::to_string(q.numel) + " elements";
          return "no such parameter in this model (keel ckpt inspect RUN lists them)";
        });
  }
}

StepSpec SpecFor(const RunConfig& cfg, const Setup& s, const std::vector<bool>& frozen) {
  StepSpec spec;
  spec.model = s.mcfg;
  spec.dtype = s.dtype;
  spec.seq_len = cfg.data.seq_len;
  spec.recompute = model::ParseRecompute(cfg.model.recompute);
  spec.layout = s.layout;
  // The moments' and gradients' dtypes reach AdamW from the state's shape (optim::ParamStore).
  spec.hyper = {cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay};
  spec.tiers = TiersOf(cfg);
  spec.offload_dir = cfg.offload.dir;
  spec.frozen = frozen;
  spec.bucket_elems = size_t(cfg.parallel.bucket_mb * 1024 * 1024 / 4);
  spec.comm_timeout_s = cfg.parallel.comm_timeout_s;
  spec.seed = cfg.train.seed;
  if (cfg.parallel.dp_sync == "diloco")
    spec.diloco = {cfg.diloco.inner_steps, cfg.diloco.outer_lr, cfg.diloco.outer_momentum,
                   cfg.diloco.fragments, cfg.diloco.overlap_steps};
  kernels::ParseDevice(cfg.train.device, &spec.device);  // validated: "cpu" or "cuda"
  return spec;
}

// What every rank reads and checks before the job's first collective (AgreeOnSetup).
struct Prepared {
  Setup s;
  RunData d;
  std::vector<float> init;  // the whole model's initial weights
  // A LoRA run's base file, read a tensor at a time as the step sets its weights (LoraBaseStreams)
  std::unique_ptr<ckpt::TensorSource> base;
  Fingerprint fingerprint;
  std::unique_ptr<ShardCheck> shard_check;
};

Prepared Prepare(const RunConfig& cfg, int rank, int world) {
  Prepared p;
  p.s = Validate(cfg, world);
  CheckFaultSpec(cfg, p.s.mcfg, world);
  const parallel::RankCoords at = parallel::Coords(p.s.layout, rank);
  p.d = OpenData(cfg, p.s.mcfg, at.dp, p.s.layout.dp, p.s.layout.micro_batch);
  std::vector<std::string> paths = {cfg.data.val};
  for (const DataSource& src : p.d.sources) paths.push_back(src.path);
  p.shard_check = std::make_unique<ShardCheck>(paths);
  // Every rank computes the whole initial state (a pure function of the seed) and keeps its part.
  // A run that may resume leaves it for later: the checkpoint brings the weights, and drawing
  // 124M normal values takes seconds of every restart (TrainRun draws them if none is found).
  // A fine-tuning file is read here all the same, so that a bad one fails before anything else.
  // LoRA's checkpoints hold its adapters only: the frozen base is read at every start, or drawn
  // a tensor at a time by the step (Run's constructor); a base file that reads a tensor at a
  // time is opened here (every header and shape checked) and read there.
  if (LoraBaseStreams(cfg) && !cfg.model.init_from.empty()) {
    p.base = ckpt::OpenInitTensors(cfg.model.init_from, p.s.mcfg);
    KEEL_CHECK(p.base, "Prepare: a streamed LoRA base whose file does not read tensor by tensor");
  } else if ((cfg.checkpoint.resume.empty() && p.s.mcfg.lora_rank == 0) ||
             !cfg.model.init_from.empty()) {
    const model::ParamLayout params = model::ParamLayout::Whole(p.s.mcfg);
    p.init.resize(params.total());
    model::InitParams(params, p.s.mcfg, cfg.train.seed, p.init.data());
    // Fine-tuning: the file's weights replace the random ones.
    if (!cfg.model.init_from.empty())
      ckpt::LoadInitWeights(cfg.model.init_from, p.s.mcfg, p.init.data(), cfg.model.init_adapter);
  }
  if (world > 1) {
    p.fingerprint = ConfigFingerprint(cfg);
    const model::ModelConfig& m = p.s.mcfg;
    p.fingerprint.emplace_back("model (resolved)", std::to_string(m.n_layer) + " layers, " +
                                                       std::to_string(m.n_head) + " heads, " +
                                                       std::to_string(m.n_embd) + " wide");
    for (size_t i = 0; i < p.d.sources.size(); ++i)
      p.fingerprint.emplace_back(
          cfg.data.sources.empty() ? "data.train" : "data.sources[" + std::to_string(i) + "]",
          DataIdentity(p.d.train_ds[i], p.d.sources[i].path));
    if (p.d.val_ds) p.fingerprint.emplace_back("data.val", DataIdentity(*p.d.val_ds, cfg.data.val));
    if (!cfg.model.init_from.empty())
      p.fingerprint.emplace_back("model.init_from", InitIdentity(cfg.model.init_from));
    p.fingerprint.emplace_back("keel build", resilience::BuildIdentity());
  }
  return p;
}

// A LoRA run's frozen base, which its checkpoints do not hold (ckpt::ReadCheckpointModel rebuilds
// it): where its weights come from and the precision it was held in. Null for other runs.
nlohmann::json BaseRecord(const RunConfig& cfg, const model::ModelConfig& mcfg) {
  if (mcfg.lora_rank <= 0) return nullptr;
  auto absolute = [](const std::string& p) {
    return p.empty() ? p : std::filesystem::absolute(p).lexically_normal().string();
  };
  return {{"init_from", absolute(cfg.model.init_from)},
          {"init_adapter", absolute(cfg.model.init_adapter)},
          {"seed", cfg.train.seed},
          {"precision", cfg.train.precision}};
}

// Everything a checkpoint holds beside the tensors and the detectors' state, after `step_done`
// steps.
nlohmann::json ScalerJson(const optim::LossScaler* s) {
  if (!s) return {{"kind", "none"}, {"scale", 1.0}};
  const optim::LossScalerState& st = s->state();
  return {{"kind", "dynamic"},
          {"scale", st.scale},
          {"growth_tracker", st.growth_tracker},
          {"hysteresis_tracker", st.hysteresis_tracker},
          {"steps_at_minimum", st.steps_at_minimum}};
}

nlohmann::json SavedState(const RunConfig& cfg, const model::ModelConfig& mcfg,
                          const parallel::ParallelDims& dims, int step_done,
                          const data::LoaderState& loader, int optimizer_step,
                          const optim::LossScaler* scaler) {
  return {{"config", ToToml(cfg)},
          {"model", ckpt::ModelConfigToJson(mcfg)},
          {"loader", data::ToJson(loader)},
          {"optimizer", {{"kind", "adamw"}, {"step", optimizer_step}}},
          {"layout", LayoutJson(dims)},
          {"scheduler",
           {{"kind", cfg.optim.schedule},
            {"position", step_done},
            {"lr", cfg.optim.lr},
            {"min_lr", cfg.optim.min_lr},
            {"warmup_steps", cfg.optim.warmup_steps},
            {"total_steps", cfg.train.steps}}},
          {"rng", {{"kind", "counter"}, {"seed", cfg.train.seed}}},
          {"loss_scaler", ScalerJson(scaler)},
          {"precision", cfg.train.precision},
          {"base", BaseRecord(cfg, mcfg)}};
}

}  // namespace

void CheckRunInput(const RunConfig& cfg, int world, bool open_data) {
  const Setup s = Validate(cfg, world);
  CheckFaultSpec(cfg, s.mcfg, world);
  if (open_data) OpenData(cfg, s.mcfg, 0, s.layout.dp, s.layout.micro_batch);
}

Run::Run(const RunConfig& cfg_in, parallel::Comm& comm_in)
    : cfg(cfg_in), comm(comm_in), lead(comm_in.rank() == 0) {
  std::optional<Prepared> prep;
  std::optional<Error> failed;
  try {
    prep = Prepare(cfg, comm.rank(), comm.size());
  } catch (const Error& e) {
    failed = e;
  }
  AgreeOnSetup(comm, failed, prep ? prep->fingerprint : Fingerprint());
  // From here on no wait outlives a lost peer: past comm_timeout_s, exit 75 (the supervisor
  // restarts the job), naming the group and the operation.
  parallel::SetDefaultWaitDeadline(cfg.parallel.comm_timeout_s);
  const Setup& s = prep->s;
  mcfg = s.mcfg;
  dtype = s.dtype;
  layout = s.layout;
  data = std::move(prep->d);
  shard_check = std::move(prep->shard_check);
  params = model::ParamLayout::Whole(mcfg);
  const std::vector<bool> frozen = FrozenParams(cfg.optim.freeze, params);
  spec = SpecFor(cfg, s, frozen);
  // Rows packed by conversation attend within their conversation only (data/windows.h).
  if (data.loader->masked()) spec.document_eos = data.train_ds[0].eos_id();
  // On GPUs the step's groups move their device buffers over NCCL (parallel/groups.h).
  const bool gpu = spec.device == kernels::Device::kCuda;
  // On a mix of CPU generations every rank runs the narrowest set of keel's kernels any rank has,
  // so that their exp and rounding agree across replicas (oneDNN still picks its GEMM kernels per
  // CPU).
  if (!gpu && comm.size() > 1)
    kernels::LimitCpuIsa(kernels::CpuIsa(int(-comm.AllReduceMax(-int(kernels::ChosenCpuIsa())))));
  // Again for a trainer embedded in another program (keel's main has flushed already): before
  // the step's threads start.
  kernels::FlushDenormals();
  if (gpu) kernels::Get(spec.device);  // binds this rank to its GPU before NCCL does
  groups = parallel::MakeGroups(comm, layout, /*nccl=*/gpu);
  step = std::make_unique<TrainStep>(spec, groups.ForStep());
  pipelined = layout.pp > 1;
  bubble_predicted = parallel::PipelineBubble(layout.pp, layout.n_micro, layout.virtual_stages);
  // LoRA: the base drawn, or read from its file, a tensor at a time, never whole in fp32; the
  // adapters start from their draws as in InitParams.
  const bool streamed = mcfg.lora_rank > 0 && prep->init.empty();
  const bool init_later = prep->init.empty() && !streamed;
  if (streamed) {
    const ckpt::TensorSource* file = prep->base.get();
    const model::TpShard tp = step->layout().tp();
    std::vector<float> whole;  // a file's tensor before this tp rank's shard is cut from it
    auto read = [&](const model::ParamInfo& q, float* out) { file->Read(q.name, out); };
    step->SetWeights([&](const model::ParamInfo& p, std::vector<float>& scratch) {
      scratch.resize(p.numel);
      if (!file || (model::IsLoraParam(p.name) && !model::IsDoraMagnitude(p.name))) {
        model::InitTensor(p, mcfg, cfg.train.seed, scratch.data(), tp);
      } else if (model::IsDoraMagnitude(p.name)) {
        model::DoraMagnitudeFrom(p, mcfg, read, scratch.data(), tp);
      } else if (tp.size == 1) {
        file->Read(p.name, scratch.data());
      } else {
        whole.resize(file->layout().Find(p.name).numel);
        file->Read(p.name, whole.data());
        model::ForEachShardRun(p, tp.size, tp.rank, [&](size_t local, size_t global, size_t n) {
          // host: the file's tensor, cut in host memory
          std::copy_n(whole.data() + global, n, scratch.data() + local);
        });
      }
      return scratch.data();
    });
    prep->base.reset();
  } else if (!init_later)
    step->SetWeights(prep->init.data());
  std::vector<float>().swap(prep->init);
  if (lead && !cfg.model.init_from.empty())
    Log("initialized the weights from %s", cfg.model.init_from.c_str());
  size_t n_frozen = 0;
  for (size_t i = 0; i < frozen.size(); ++i)
    if (frozen[i]) n_frozen += params.params()[i].numel;
  if (lead && mcfg.fp8)
    Log("fp8 block products (E4M3 inputs and weights, E5M2 gradients; %s): blocks 1-%d of %d, "
        "%s scaling%s",
        step->backend().NativeFp8(16, 16, 16) ? "fp8 tensor cores" : "emulated", mcfg.n_layer - 2,
        mcfg.n_layer, cfg.train.fp8_recipe.c_str(),
        mcfg.n_layer < 3 ? " (none: the first and last blocks stay in bf16)" : "");
  if (lead && mcfg.lora_rank > 0)
    Log("keel: LoRA rank %d%s, alpha %g on %s: %zu adapter parameters trained, %zu frozen",
        mcfg.lora_rank, mcfg.lora_dora ? " (DoRA)" : "", double(mcfg.lora_alpha),
        model::LoraTargetsText(mcfg).c_str(), params.total() - n_frozen, n_frozen);
  else if (lead && n_frozen)
    Log("keel: [optim] freeze: %zu of %zu parameters are not trained", n_frozen, params.total());
  sched = optim::LrSchedule{optim::LrSchedule::ParseKind(cfg.optim.schedule), cfg.optim.lr,
                            cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};
  // Not refused (short test runs keep the default warmup), but the lr never reaches [optim] lr.
  if (lead && cfg.optim.warmup_steps >= cfg.train.steps)
    Log("keel: warning: [optim] warmup_steps = %d is not below train.steps = %d: the whole run "
        "warms up and its last step trains at lr %.3g of %.3g",
        cfg.optim.warmup_steps, cfg.train.steps, sched.At(cfg.train.steps - 1), cfg.optim.lr);

  sum.run_dir = (std::filesystem::path(cfg.train.out_dir) / cfg.train.name).string();
  ckpt = std::make_unique<Checkpointer>(cfg, comm, sum.run_dir, lead ? &events : nullptr,
                                        step->backend());
  {
    // A bad request fails here, before the run folder is touched, on every rank alike (a folder
    // one rank cannot see would otherwise leave the others waiting in the resume's collectives).
    // So does a run folder that another job holds, or a metrics port that is taken.
    std::optional<Error> bad_request;
    try {
      ckpt->CheckResumeRequest();
      // Every rank writes its pieces of each checkpoint: each checks where, before the first
      // step (a file in the way on one host would otherwise surface at the first save).
      CheckCanCreateFolder("[checkpoint] dir", ckpt->root());
      if (lead) {
        if (cfg.monitor.metrics_port > 0) {
          exporter = std::make_unique<monitor::MetricsExporter>(
              cfg.monitor.metrics_addr, cfg.monitor.metrics_port, cfg.monitor.metrics_token);
          Log("keel: Prometheus metrics at %s", exporter->url().c_str());
        }
        lock = FolderLock::Acquire(sum.run_dir, "keel train");  // creates the run folder
      }
    } catch (const Error& e) {
      bad_request = e;
    }
    ShareError(comm, bad_request);
  }
  if (lead) {
    WriteFileAtomic(sum.run_dir + "/config.toml", ToToml(cfg));
    events = monitor::JsonlWriter(sum.run_dir + "/events.jsonl");
    sum.unigram_entropy = data.UnigramEntropy();
  }

  ResumeOrInit(init_later);
  if (start_step > cfg.train.steps)
    ThrowBadInput("[train] steps: " + std::to_string(cfg.train.steps) +
                  " is below the step of the checkpoint resumed (" + sum.resumed_from + ", step " +
                  std::to_string(start_step) + "): raise train.steps to continue that run");
  if (cfg.train.stop_at > 0 && cfg.train.stop_at <= start_step && start_step < cfg.train.steps)
    ThrowBadInput("[train] stop_at: " + std::to_string(cfg.train.stop_at) +
                  " is already passed: the run resumes at step " + std::to_string(start_step) +
                  " (" + sum.resumed_from + "); raise it, or set 0 to train to train.steps = " +
                  std::to_string(cfg.train.steps));
  sum.steps_done = start_step;
  if (start_step == cfg.train.steps && start_step > 0) {
    sum.nothing_left = true;  // a finished run: nothing is trained, saved or rewritten
    return;
  }
  ckpt->Prepare(state);
  if (lead) {
    // Steps past the checkpoint were lost with the crash; the resumed run writes them again.
    RestartRecordAt(start_step);
    std::filesystem::remove(sum.run_dir + "/model.safetensors");
    events.Write({{"event", "start"},
                  {"step", start_step},
                  {"ranks", comm.size()},
                  {"resumed_from", sum.resumed_from}});
    if (resumed) SayScheduleChange();
  }

  MeasureAndLogStart();

  // Micro-batches prepared ahead by a background thread; the loader belongs to it from here on.
  // The order is the loader's cursor order, i.e. exactly Fill(step, k) for k = 0..n_micro-1.
  prefetch.emplace(*data.loader, layout.micro_batch, cfg.data.prefetch);
}

Run::~Run() = default;

// A resume under another learning-rate schedule (train.steps raised to go on, a new lr or warmup)
// moves the lr at once: said in one line and an event, with the lr the next step takes under each,
// since only the step line's lr figure would show it otherwise. Not refused: raising train.steps
// is how a finished run goes on.
void Run::SayScheduleChange() {
  const nlohmann::json saved = resumed->state.value("scheduler", nlohmann::json::object());
  if (!saved.is_object() || saved.empty()) return;
  std::string changed;
  auto differs = [&](const char* key, const nlohmann::json& now) {
    const nlohmann::json was = saved.value(key, now);
    if (was == now) return;
    // An lr saved from a float reads back as 0.0006000000284984708: shown as %g.
    auto text = [](const nlohmann::json& j) {
      if (!j.is_number_float()) return j.dump();
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g", j.get<double>());
      return std::string(buf);
    };
    changed +=
        std::string(changed.empty() ? "" : ", ") + key + " " + text(was) + " -> " + text(now);
  };
  differs("kind", cfg.optim.schedule);
  differs("lr", cfg.optim.lr);
  differs("min_lr", cfg.optim.min_lr);
  differs("warmup_steps", cfg.optim.warmup_steps);
  differs("total_steps", cfg.train.steps);
  if (changed.empty()) return;
  const optim::LrSchedule before{
      optim::LrSchedule::ParseKind(saved.value("kind", cfg.optim.schedule)),
      saved.value("lr", cfg.optim.lr), saved.value("min_lr", cfg.optim.min_lr),
      saved.value("warmup_steps", cfg.optim.warmup_steps),
      saved.value("total_steps", cfg.train.steps)};
  const double lr = sched.At(start_step), was = before.At(start_step);
  Log("keel: the learning-rate schedule differs from the checkpoint's (%s): step %d trains at lr "
      "%.3g, %.3g under the checkpoint's schedule",
      changed.c_str(), start_step + 1, lr, was);
  events.Write({{"event", "schedule_changed"},
                {"step", start_step},
                {"changed", changed},
                {"lr", lr},
                {"checkpoint_lr", was}});
}

void Run::ResumeOrInit(bool init_later) {
  if (cfg.loss_scale.kind == "dynamic" ||
      (cfg.loss_scale.kind == "auto" && cfg.train.precision == "fp16")) {
    const LossScaleSection& l = cfg.loss_scale;
    scaler = std::make_unique<optim::LossScaler>(optim::LossScalerConfig{
        l.initial, l.min, l.growth, l.backoff, l.growth_interval, l.hysteresis});
  }
  // The state a checkpoint holds: master weights and both AdamW moments (fp32 on disk), tensor by
  // tensor, over the slice of the layout this rank holds.
  state = step->StateView();
  resumed = ckpt->Resume(state);
  if (resumed) {
    start_step = int(resumed->step);
    step->Restored(resumed->state.at("optimizer").at("step").get<int>(), start_step,
                   resumed->own_missing, ReplicasThatSaved(resumed->state));
    // The scaler goes on where it was; a checkpoint without one (or a run that adds one) starts
    // it afresh.
    const nlohmann::json ls = resumed->state.value("loss_scaler", nlohmann::json::object());
    if (scaler && ls.value("kind", "none") == "dynamic")
      scaler->Restore({ls.at("scale").get<double>(), ls.at("growth_tracker").get<int>(),
                       ls.at("hysteresis_tracker").get<int>(),
                       ls.at("steps_at_minimum").get<int>()});
    data.loader->restore(data::LoaderStateFromJson(resumed->state.at("loader")));
    if (resumed->state.contains("precision_switch"))
      switched_at = resumed->state.at("precision_switch").at("step").get<int>();
    sum.resumed_from = resumed->path;
  } else if (init_later) {
    std::vector<float> init(params.total());
    model::InitParams(params, mcfg, cfg.train.seed, init.data());
    step->SetWeights(init.data());
  }
}

void Run::MeasureAndLogStart() {
  const int T = cfg.data.seq_len;
  flops_per_token =
      monitor::TrainFlopsPerToken(double(model::MatmulParams(mcfg)), mcfg.n_layer, mcfg.n_embd, T);
  // LoRA's frozen base computes no weight gradients: 2 of its 6 FLOPs per weight are not done.
  if (mcfg.lora_rank > 0)
    flops_per_token -= 2.0 * double(model::MatmulParams(model::BaseModel(mcfg)));
  // MFU's denominator: every rank's measured peak (ranks may sit on different CPUs).
  // On a GPU: its data sheet's dense peak, unless [monitor] peak_gflops says otherwise.
  RunFacts facts;
  facts.threads = omp_get_max_threads();
  if (spec.device == kernels::Device::kCuda && cfg.monitor.peak_gflops <= 0)
    facts.rank_peak = {step->backend().PeakFlops(dtype),
                       step->backend().name() +
                           "'s dense peak (0: not in keel's table; set [monitor] "
                           "peak_gflops)"};
  else
    facts.rank_peak = monitor::MachinePeak(
        dtype, facts.threads, cfg.monitor.peak_gflops,
        kernels::ProductsHeldToAvx2() ? monitor::PeakScope::kAvx2 : monitor::PeakScope::kCpu);
  peak = comm.AllReduceSum(facts.rank_peak.flops);
  tokens_per_step = double(cfg.train.batch_size) * T;
  scored = tokens_per_step;
  dloss = float(1.0 / scored);
  // What this rank allocated, by kind: the numbers `keel plan --accounting keel` predicts.
  facts.memory = step->MemoryBytes();
  for (const auto& [kind, bytes] : facts.memory.items()) memory_bytes += bytes.get<size_t>();
  // Pipeline stages hold different parts of the model: each stage's total, for rank 0's log
  // (every rank takes part; a stage's data-parallel ranks differ only by ZeRO rounding).
  facts.stage_bytes.assign(size_t(layout.pp), 0.0);
  facts.stage_bytes[size_t(groups.at.pp)] = double(memory_bytes);
  if (pipelined) comm.AllReduceMax(facts.stage_bytes.data(), facts.stage_bytes.size());
  // The step's record: console, metrics.jsonl, Prometheus, [monitor.alerts] (rank 0's).
  report = std::make_unique<StepReporter>(
      cfg, comm, cfg.train.stop_at > 0 ? cfg.train.stop_at : cfg.train.steps,
      lead ? &events : nullptr, ckpt->root(), std::move(exporter));
  ckpt->set_on_commit(report->CommitHook());
  if (lead) report->LogStart(*this, facts);
}

void Run::Reposition(const data::LoaderState& st) {
  prefetch.reset();
  data.loader->restore(st);
  prefetch.emplace(*data.loader, layout.micro_batch, cfg.data.prefetch);
}

void Run::SkipBatches(int step_i, int n) {
  data::LoaderState st = prefetch->state();
  st.position += uint64_t(n) * uint64_t(cfg.train.batch_size);
  Reposition(st);
  if (lead) {
    Log("keel: step %d: skipping %d batch(es) of data (RUN/rollbacks.json or [resilience] "
        "skip_batches)",
        step_i + 1, n);
    events.Write({{"event", "data_skip"}, {"step", step_i}, {"batches", n}});
  }
}

void Run::RestartRecordAt(int step_done) {
  KeepMetricsUpTo(sum.run_dir + "/metrics.jsonl", step_done);
  // A rollback's writer keeps its count of lost lines (a fresh one would let the run exit 0).
  if (metrics.is_open())
    metrics.Reopen();
  else if (cfg.monitor.metrics_jsonl)
    metrics = monitor::JsonlWriter(sum.run_dir + "/metrics.jsonl");
}

double Run::Validate() {
  // On a terminal only: a log gets the pass's result on the step line, not its progress.
  return Evaluate(
             *data.val_ds, *data.val_plan, comm, groups.at.dp, layout.dp,
             [&](const int32_t* t, const int32_t* y) { return step->Forward(t, y); },
             lead && isatty(2))
      .loss;
}

ckpt::StateView Run::SaveView(int step_done, const nlohmann::json& guards_state) {
  // What the view's buffers hold for streaming DiLoCo and fp8 is brought up to date: they are
  // copied from here on.
  step->BeforeSave();
  ckpt::StateView v = state;
  v.step = step_done;
  v.tokens = uint64_t(step_done) * uint64_t(tokens_per_step);
  v.state = guards_state;  // "resilience" and "metrics"
  v.state.update(SavedState(cfg, mcfg, layout, step_done, prefetch->state(), step->store().step(),
                            scaler.get()));
  if (switched_at >= 0)
    v.state["precision_switch"] = {{"from", "fp16"}, {"to", "bf16"}, {"step", switched_at}};
  return v;
}

}  // namespace keel::train

#include "keel/train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "keel/ckpt/checkpoint_model.h"
#include "keel/ckpt/model_file.h"
#include "keel/ckpt/model_source.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/log.h"
#include "keel/core/progress.h"
#include "keel/core/stop_signal.h"
#include "keel/core/timer.h"
#include "keel/data/dataset.h"
#include "keel/data/loader.h"
#include "keel/data/prefetcher.h"
#include "keel/kernels/cpu/matmul.h"
#include "keel/model/params.h"
#include "keel/monitor/flops.h"
#include "keel/monitor/jsonl.h"
#include "keel/optim/schedule.h"
#include "keel/parallel/groups.h"
#include "keel/parallel/pipeline_schedule.h"
#include "keel/resilience/build_id.h"
#include "keel/resilience/fault_inject.h"
#include "keel/resilience/heartbeat.h"
#include "keel/resilience/straggler.h"
#include "keel/resilience/watchdog.h"
#include "keel/train/checkpointing.h"
#include "keel/train/evaluation.h"
#include "keel/train/freeze.h"
#include "keel/train/guards.h"
#include "keel/train/memory_check.h"
#include "keel/train/rank_agreement.h"
#include "keel/train/samples.h"
#include "keel/train/shard_check.h"
#include "keel/train/step.h"
#include "keel/train/step_report.h"

namespace keel::train {
namespace {

// Entropy of the token distribution (nats): the loss of the best model that ignores context.
// A model that learned anything sits well below it. Counts at most the first 20M tokens.
// For a blend, the entropy of the weighted mixture of the sources' distributions, which is what
// the trainer samples from. Counts at most the first 20M tokens of each source.
double UnigramEntropy(const std::vector<const data::TokenDataset*>& sources,
                      const std::vector<double>& weights) {
  size_t vocab = 0;
  for (const auto* ds : sources) vocab = std::max<size_t>(vocab, ds->vocab_size());
  double total_weight = 0;
  for (double w : weights) total_weight += w;
  std::vector<double> p(vocab, 0.0);
  std::vector<int32_t> chunk(1 << 16);
  for (size_t s = 0; s < sources.size(); ++s) {
    const data::TokenDataset& ds = *sources[s];
    const size_t n = std::min<size_t>(ds.size(), 20'000'000);
    std::vector<uint64_t> counts(vocab, 0);
    for (size_t i = 0; i < n; i += chunk.size()) {
      size_t m = std::min(chunk.size(), n - i);
      ds.Read(i, m, chunk.data());
      for (size_t j = 0; j < m; ++j) counts[chunk[j]]++;
    }
    const double share = weights[s] / total_weight;
    for (size_t v = 0; v < vocab; ++v)
      if (counts[v]) p[v] += share * (double(counts[v]) / n);
  }
  double h = 0;
  for (double q : p)
    if (q > 0) h -= q * std::log(q);
  return h;
}

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
  const TrainSection& t = cfg.train;
  s.dtype = t.precision == "fp32" ? DType::kF32 : DType::kBF16;
  if (cfg.data.train.empty() && cfg.data.sources.empty())
    ThrowBadInput("[data] train: expected a dataset path (or [[data.sources]]), got nothing");
  // Before anything large is allocated.
  CheckMemoryFits(cfg, s.layout, s.layout.micro_batch, s.layout.n_micro);
  return s;
}

// The run's data: the training sources (a blend, or one plain dataset) and the validation set,
// opened and checked against the model's vocabulary, with this data-parallel rank's loaders.
struct RunData {
  std::vector<DataSource> sources;
  std::vector<data::TokenDataset> train_ds;
  std::vector<const data::TokenDataset*> train_ptrs;
  std::vector<double> weights;
  std::unique_ptr<data::TokenDataset> val_ds;
  std::unique_ptr<data::BatchLoader> loader;
  // The validation windows (evaluation.h): the same ones at every validation and in `keel eval`.
  std::optional<EvalPlan> val_plan;
};

RunData OpenData(const RunConfig& cfg, const model::ModelConfig& mcfg, int dp_rank, int dp,
                 int micro_batch) {
  const int T = cfg.data.seq_len;
  RunData d;
  // `train = "path"` is a blend of one source with weight 1; it keeps the plain loader below, so
  // that its sample order (and every pinned loss) is exactly what it was before blending.
  d.sources = cfg.data.sources;
  if (d.sources.empty()) d.sources.push_back({cfg.data.train, 1.0});
  d.train_ds.reserve(d.sources.size());  // the loader keeps pointers into it
  for (const DataSource& src : d.sources) {
    d.train_ds.push_back(data::TokenDataset::Open(src.path));
    d.train_ds.back().CheckIds(mcfg.vocab_size);
    d.train_ptrs.push_back(&d.train_ds.back());
    d.weights.push_back(src.weight);
  }
  if (!cfg.data.val.empty()) {
    d.val_ds = std::make_unique<data::TokenDataset>(data::TokenDataset::Open(cfg.data.val));
    d.val_ds->CheckIds(mcfg.vocab_size);
  }
  d.loader =
      d.train_ds.size() == 1
          ? std::make_unique<data::BatchLoader>(d.train_ds[0], T, cfg.train.batch_size, dp_rank, dp,
                                                cfg.train.seed,
                                                /*shuffle=*/true)
          : std::make_unique<data::BatchLoader>(d.train_ptrs, d.weights, T, cfg.train.batch_size,
                                                dp_rank, dp, cfg.train.seed);
  // The first val_batches × batch_size windows of the split (all of it for 0), in micro-batches:
  // `keel eval --max-tokens (that × seq_len) --batch (micro-batch)` prints the same number.
  if (d.val_ds)
    d.val_plan = PlanEval(d.val_ds->size(), T, micro_batch,
                          size_t(cfg.train.val_batches) * size_t(cfg.train.batch_size),
                          "[data] val " + cfg.data.val);
  return d;
}

StepSpec SpecFor(const RunConfig& cfg, const Setup& s, const std::vector<bool>& frozen) {
  StepSpec spec;
  spec.model = s.mcfg;
  spec.dtype = s.dtype;
  spec.seq_len = cfg.data.seq_len;
  spec.recompute = model::ParseRecompute(cfg.model.recompute);
  spec.layout = s.layout;
  spec.hyper = {cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay};
  spec.frozen = frozen;
  spec.bucket_elems = size_t(cfg.parallel.bucket_mb * 1024 * 1024 / 4);
  spec.comm_timeout_s = cfg.parallel.comm_timeout_s;
  kernels::ParseDevice(cfg.train.device, &spec.device);  // validated: "cpu" or "cuda"
  return spec;
}

// Everything a checkpoint holds beside the tensors, after `step_done` steps.
nlohmann::json SavedState(const RunConfig& cfg, const Setup& s, int step_done,
                          const data::LoaderState& loader, int optimizer_step,
                          const std::vector<double>& recent_losses,
                          const nlohmann::json& detectors) {
  return {
      {"resilience", detectors},
      {"config", ToToml(cfg)},
      {"model", ckpt::ModelConfigToJson(s.mcfg)},
      {"loader", data::ToJson(loader)},
      {"optimizer", {{"kind", "adamw"}, {"step", optimizer_step}}},
      {"layout",
       {{"dp", s.layout.dp}, {"tp", s.layout.tp}, {"pp", s.layout.pp}, {"zero", s.layout.zero}}},
      {"scheduler",
       {{"kind", cfg.optim.schedule},
        {"position", step_done},
        {"lr", cfg.optim.lr},
        {"min_lr", cfg.optim.min_lr},
        {"warmup_steps", cfg.optim.warmup_steps},
        {"total_steps", cfg.train.steps}}},
      {"rng", {{"kind", "counter"}, {"seed", cfg.train.seed}}},
      {"loss_scaler", {{"kind", "none"}, {"scale", 1.0}}},
      {"precision", cfg.train.precision},
      {"metrics", {{"recent_losses", recent_losses}}}};
}

// What every rank reads and checks before the job's first collective (AgreeOnSetup).
struct Prepared {
  Setup s;
  RunData d;
  std::vector<float> init;  // the whole model's initial weights
  Fingerprint fingerprint;
  std::unique_ptr<ShardCheck> shard_check;
};

Prepared Prepare(const RunConfig& cfg, int rank, int world) {
  Prepared p;
  p.s = Validate(cfg, world);
  const parallel::RankCoords at = parallel::Coords(p.s.layout, rank);
  p.d = OpenData(cfg, p.s.mcfg, at.dp, p.s.layout.dp, p.s.layout.micro_batch);
  std::vector<std::string> paths = {cfg.data.val};
  for (const DataSource& src : p.d.sources) paths.push_back(src.path);
  p.shard_check = std::make_unique<ShardCheck>(paths);
  // Every rank computes the whole initial state (a pure function of the seed) and keeps its part.
  // A run that may resume leaves it for later: the checkpoint brings the weights, and drawing
  // 124M normal values takes seconds of every restart (TrainRun draws them if none is found).
  // A fine-tuning file is read here all the same, so that a bad one fails before anything else.
  if (cfg.checkpoint.resume.empty() || !cfg.model.init_from.empty()) {
    const model::ParamLayout layout = model::ParamLayout::Whole(p.s.mcfg);
    p.init.resize(layout.total());
    model::InitParams(layout, p.s.mcfg, cfg.train.seed, p.init.data());
    // Fine-tuning: the file's weights replace the random ones.
    if (!cfg.model.init_from.empty())
      ckpt::LoadInitWeights(cfg.model.init_from, p.s.mcfg, p.init.data());
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
    p.fingerprint.emplace_back("keel build", resilience::BuildIdentity());
  }
  return p;
}

}  // namespace

namespace {

TrainSummary TrainRun(const RunConfig& cfg, parallel::Comm& comm,
                      resilience::HeartbeatWriter& heartbeat) {
  const bool lead = comm.rank() == 0;
  // Everything that can be wrong with the input is found before the run directory exists, and
  // before the first collective: a rank's error reaches every rank, and ranks that would run
  // different things do not start.
  std::optional<Prepared> prep;
  std::optional<Error> failed;
  try {
    prep = Prepare(cfg, comm.rank(), comm.size());
  } catch (const Error& e) {
    failed = e;
  }
  AgreeOnSetup(comm, failed, prep ? prep->fingerprint : Fingerprint());
  const Setup& s = prep->s;
  const int T = cfg.data.seq_len;
  const auto& mcfg = s.mcfg;
  RunData& d = prep->d;
  data::BatchLoader& loader = *d.loader;
  const std::vector<DataSource>& sources = d.sources;
  const std::vector<double>& weights = d.weights;
  const parallel::Layout& dims = s.layout;
  const model::ParamLayout layout = model::ParamLayout::Whole(mcfg);
  const std::vector<bool> frozen = FrozenParams(cfg.optim.freeze, layout);
  const StepSpec spec = SpecFor(cfg, s, frozen);
  // On GPUs the step's groups move their device buffers over NCCL (parallel/groups.h).
  const bool gpu = spec.device == kernels::Device::kCuda;
  if (gpu) kernels::Get(spec.device);  // binds this rank to its GPU before NCCL does
  const parallel::Groups groups = parallel::MakeGroups(comm, dims, /*nccl=*/gpu);
  TrainStep step(spec, groups.ForStep());
  const bool pipelined = dims.pp > 1;
  const double bubble_predicted =
      parallel::PipelineBubble(dims.pp, s.layout.n_micro, cfg.parallel.virtual_stages);
  const bool init_later = prep->init.empty();
  if (!init_later) step.SetWeights(prep->init.data());
  std::vector<float>().swap(prep->init);
  if (lead && !cfg.model.init_from.empty())
    Log("initialized the weights from %s", cfg.model.init_from.c_str());
  size_t n_frozen = 0;
  for (size_t i = 0; i < frozen.size(); ++i)
    if (frozen[i]) n_frozen += layout.params()[i].numel;
  if (lead && n_frozen)
    Log("keel: [optim] freeze: %zu of %zu parameters are not trained", n_frozen, layout.total());
  optim::LrSchedule sched{optim::LrSchedule::ParseKind(cfg.optim.schedule), cfg.optim.lr,
                          cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};

  TrainSummary sum;
  sum.run_dir = (std::filesystem::path(cfg.train.out_dir) / cfg.train.name).string();
  monitor::JsonlWriter metrics, events;
  Checkpointer ckpt(cfg, comm, sum.run_dir, lead ? &events : nullptr, step.backend());
  {
    // A bad request fails here, before the run folder is touched, on every rank alike (a folder
    // one rank cannot see would otherwise leave the others waiting in the resume's collectives).
    std::optional<Error> bad_request;
    try {
      ckpt.CheckResumeRequest();
    } catch (const Error& e) {
      bad_request = e;
    }
    ShareError(comm, bad_request);
  }
  if (lead) {
    std::filesystem::create_directories(sum.run_dir);
    WriteFileAtomic(sum.run_dir + "/config.toml", ToToml(cfg));
    events = monitor::JsonlWriter(sum.run_dir + "/events.jsonl");
    sum.unigram_entropy = UnigramEntropy(d.train_ptrs, weights);
  }

  // The state a checkpoint holds: fp32 master weights and both AdamW moments, tensor by tensor,
  // over the slice of the layout this rank holds.
  const ckpt::StateView state = step.StateView();
  int start_step = 0;
  std::vector<double> recent_losses;  // the last few, for the log's record; kept across resumes
  // The detectors of docs/RESILIENCE.md; their windows are part of each checkpoint.
  const ResilienceSection& rs = cfg.resilience;
  StepJudge judge(rs);
  auto restore_detectors = [&](const nlohmann::json& st) {
    recent_losses = st.at("metrics").at("recent_losses").get<std::vector<double>>();
    judge.FromJson(st.value("resilience", nlohmann::json::object()));
  };
  if (auto r = ckpt.Resume(state)) {
    restore_detectors(r->state);
    start_step = int(r->step);
    step.Restored(r->state.at("optimizer").at("step").get<int>());
    loader.restore(data::LoaderStateFromJson(r->state.at("loader")));
    sum.resumed_from = r->path;
  } else if (init_later) {
    std::vector<float> init(layout.total());
    model::InitParams(layout, mcfg, cfg.train.seed, init.data());
    step.SetWeights(init.data());
  }
  if (start_step > cfg.train.steps)
    ThrowBadInput("[train] steps: " + std::to_string(cfg.train.steps) +
                  " is below the step of the checkpoint resumed (" + sum.resumed_from + ", step " +
                  std::to_string(start_step) + "): raise train.steps to continue that run");
  if (cfg.train.stop_at > 0 && cfg.train.stop_at <= start_step && start_step < cfg.train.steps)
    ThrowBadInput("[train] stop_at: " + std::to_string(cfg.train.stop_at) +
                  " is already passed: the run resumes at step " + std::to_string(start_step) +
                  " (" + sum.resumed_from + "); raise it, or set 0 to train to train.steps = " +
                  std::to_string(cfg.train.steps));
  if (start_step == cfg.train.steps && start_step > 0) {
    // A finished run: nothing is trained, saved or rewritten. The heartbeat says where the run
    // stands, so that a supervisor whose earlier start already reached the end reports that step.
    heartbeat.Set(start_step, "done");
    sum.steps_done = start_step;
    sum.nothing_left = true;
    return sum;
  }
  ckpt.Prepare(state);
  if (lead) {
    // Steps past the checkpoint were lost with the crash; the resumed run writes them again.
    KeepMetricsUpTo(sum.run_dir + "/metrics.jsonl", start_step);
    std::filesystem::remove(sum.run_dir + "/model.safetensors");
    if (cfg.monitor.metrics_jsonl) metrics = monitor::JsonlWriter(sum.run_dir + "/metrics.jsonl");
    events.Write({{"event", "start"},
                  {"step", start_step},
                  {"ranks", comm.size()},
                  {"resumed_from", sum.resumed_from}});
  }

  const double flops_per_token =
      monitor::TrainFlopsPerToken(double(model::MatmulParams(mcfg)), mcfg.n_layer, mcfg.n_embd, T);
  const int threads = omp_get_max_threads();
  // MFU's denominator: every rank's measured peak (ranks may sit on different CPUs).
  // On a GPU: its data sheet's dense peak, unless [monitor] peak_gflops says otherwise.
  monitor::Peak rank_peak;
  if (spec.device == kernels::Device::kCuda && cfg.monitor.peak_gflops <= 0)
    rank_peak = {step.backend().PeakFlops(s.dtype),
                 step.backend().name() +
                     "'s dense peak (0: not in keel's table; set [monitor] "
                     "peak_gflops)"};
  else
    rank_peak = monitor::MachinePeak(s.dtype, threads, cfg.monitor.peak_gflops);
  const double peak = comm.AllReduceSum(rank_peak.flops);
  const double tokens_per_step = double(cfg.train.batch_size) * T;
  const float dloss = float(1.0 / tokens_per_step);
  // What this rank allocated, by kind: the numbers `keel plan --accounting keel` predicts.
  const nlohmann::json memory = step.MemoryBytes();
  size_t memory_total = 0;
  for (const auto& [kind, bytes] : memory.items()) memory_total += bytes.get<size_t>();
  // Pipeline stages hold different parts of the model: each stage's total, for rank 0's log
  // (every rank takes part; a stage's data-parallel ranks differ only by ZeRO rounding).
  std::vector<double> stage_bytes(size_t(dims.pp), 0.0);
  stage_bytes[size_t(groups.at.pp)] = double(memory_total);
  if (pipelined) comm.AllReduceMax(stage_bytes.data(), stage_bytes.size());
  if (lead) {
    Log("keel: %s %s, %zu parameters, %d rank(s) × %d thread(s), batch %d × %d tokens, "
        "%d micro-batch(es) of %d",
        cfg.model.name.c_str(), DTypeName(s.dtype), layout.total(), comm.size(), threads,
        cfg.train.batch_size, T, s.layout.n_micro, s.layout.micro_batch);
    Log("keel: layout %s over %d rank(s)", parallel::DimsName(dims).c_str(), comm.size());
    Log("keel: MFU against a peak of %.1f GFLOP/s for rank 0's %d thread(s) in %s (%s); %.1f "
        "GFLOP/s for all ranks",
        rank_peak.flops / 1e9, threads, DTypeName(s.dtype), rank_peak.source.c_str(), peak / 1e9);
    if (dims.tp > 1)
      Log("keel: tensor parallel: %d ranks, each with %d of %d heads, %d of %d MLP units and %d "
          "of %d vocabulary rows%s",
          dims.tp, mcfg.n_head / dims.tp, mcfg.n_head, 4 * mcfg.n_embd / dims.tp, 4 * mcfg.n_embd,
          mcfg.padded_vocab() / dims.tp, mcfg.padded_vocab(),
          cfg.parallel.sp
              ? ("; sequence parallel: " + std::to_string(s.layout.micro_batch * T / dims.tp) +
                 " of " + std::to_string(s.layout.micro_batch * T) + " rows per micro-batch")
                    .c_str()
              : "");
    if (pipelined) {
      const int v = spec.layout.virtual_stages;
      std::string shape;  // " of 9+3 layers", or " x 2 interleaved chunks of 3 layer(s)"
      if (v > 1) {
        shape = " x " + std::to_string(v) + " interleaved chunks of " +
                std::to_string(mcfg.n_layer / (dims.pp * v)) + " layer(s)";
      } else {
        for (int i = 0; i < dims.pp; ++i)
          shape += (i ? "+" : " of ") + std::to_string(spec.layout.stage_layers.empty()
                                                           ? mcfg.n_layer / dims.pp
                                                           : spec.layout.stage_layers[size_t(i)]);
        shape += " layers";
      }
      Log("keel: pipeline: %d stages%s, 1F1B over %d micro-batches; predicted bubble %.1f%% "
          "((pp - 1) / (m + pp - 1)%s)",
          dims.pp, shape.c_str(), s.layout.n_micro, 100 * bubble_predicted,
          v > 1 ? " / v" : ", as keel plan");
    }
    std::string kinds;
    for (const auto& [kind, bytes] : memory.items())
      if (bytes.get<size_t>())
        kinds += (kinds.empty() ? "" : ", ") + kind + " " +
                 std::to_string(bytes.get<size_t>() / 1048576.0).substr(0, 6);
    Log("keel: memory per rank (MiB): %s; total %.1f MiB", kinds.c_str(), memory_total / 1048576.0);
    nlohmann::json event = {
        {"event", "memory"}, {"bytes", memory}, {"layout", parallel::DimsName(dims)}};
    if (pipelined) {
      std::string per;
      for (double b : stage_bytes)
        per += (per.empty() ? "" : ", ") + std::to_string(b / 1048576.0).substr(0, 6);
      Log("keel: memory per pipeline stage (MiB, the figures above are stage 0's): %s",
          per.c_str());
      event["stage_bytes"] = stage_bytes;
    }
    events.Write(event);
  }
  if (lead) {
    // Which data the run draws from, with each source's share, so a log says what was trained.
    double total_weight = 0;
    for (double w : weights) total_weight += w;
    for (size_t i = 0; i < sources.size(); ++i)
      Log("keel: data source %zu: %s, weight %g (%.1f%%), %zu tokens", i, sources[i].path.c_str(),
          weights[i], 100 * weights[i] / total_weight, d.train_ds[i].size());
  }

  std::vector<int32_t> tokens(size_t(s.layout.micro_batch) * T), targets(tokens.size());
  auto validate = [&]() {
    // On a terminal only: a log gets the pass's result on the step line, not its progress.
    return Evaluate(
               *d.val_ds, *d.val_plan, comm, groups.at.dp, dims.dp,
               [&](const int32_t* t, const int32_t* y) { return step.Forward(t, y); },
               lead && isatty(2))
        .loss;
  };

  // Micro-batches prepared ahead by a background thread; the loader belongs to it from here on.
  // The order is the loader's cursor order, i.e. exactly Fill(step, k) for k = 0..n_micro-1.
  std::optional<data::Prefetcher> prefetch;
  prefetch.emplace(loader, s.layout.micro_batch, cfg.data.prefetch);

  // Faults to inject (KEEL_FAULT), fired once per run: the markers live in the run folder.
  resilience::FaultInjector faults = resilience::FaultInjector::FromEnv(comm.rank());
  faults.SetMarkerDir(sum.run_dir + "/faults");
  RollbackLog rollbacks(sum.run_dir + "/rollbacks.json", *ParseSkipBatches(rs.skip_batches));
  resilience::StragglerTracker stragglers(rs.straggler_ratio, rs.straggler_checks);
  const std::vector<std::string> hosts = GatherHosts(comm);
  // The world rank of each data-parallel peer, for naming a replica that disagrees.
  const std::vector<double> dp_world_ranks = GatherPerRank(*groups.dp, comm.rank());
  const bool sdc_on = rs.sdc_every > 0 && dims.dp > 1 && CanCompareReplicas(step, dims.zero);
  if (lead && rs.sdc_every > 0 && dims.dp > 1 && !sdc_on)
    Log("keel: [resilience] sdc_every: ZeRO %d keeps no replica of the weights to compare; the "
        "silent-corruption check is off",
        dims.zero);
  double compute_since = 0;  // this rank's compute (ms) since the last straggler check
  const char* beat_dir = std::getenv("KEEL_HEARTBEAT_DIR");
  resilience::HangWatchdog watchdog(
      rs.hang_timeout_s, beat_dir ? beat_dir : "", comm.rank(),
      [&](const std::string& line, bool self) {
        if (self) heartbeat.BlameSelf();
        Log("keel: %s; exiting 75 so that keel launch restarts the job", line.c_str());
        heartbeat.Finish(int(ExitCode::kTempFail), line);
        std::fflush(nullptr);
        std::_Exit(int(ExitCode::kTempFail));
      });
  // `done`: the steps the heartbeat reports (the step's own once it is done, at the checkpoint).
  auto hang_if_due = [&](int step_i, const char* phase, int done) {
    heartbeat.Set(done, phase);
    if (!faults.Take(resilience::FaultKind::kHang, step_i, phase)) return;
    Log("keel: injected fault: rank %d hangs in step %d, phase %s", comm.rank(), step_i + 1, phase);
    for (;;) pause();
  };
  // The data from position `st` on: the prefetcher stops, the loader moves, a new one starts.
  auto reposition = [&](const data::LoaderState& st) {
    prefetch.reset();
    loader.restore(st);
    prefetch.emplace(loader, s.layout.micro_batch, cfg.data.prefetch);
  };
  // Moves the data past `n` global batches at the boundary before step `step_i` (a rollback's
  // skipped window, or [resilience] skip_batches).
  auto skip_batches = [&](int step_i, int n) {
    data::LoaderState st = prefetch->state();
    st.position += uint64_t(n) * uint64_t(cfg.train.batch_size);
    reposition(st);
    if (lead) {
      Log("keel: step %d: skipping %d batch(es) of data (RUN/rollbacks.json or [resilience] "
          "skip_batches)",
          step_i + 1, n);
      events.Write({{"event", "data_skip"}, {"step", step_i}, {"batches", n}});
    }
  };
  // Back to the newest checkpoint at or before `spike_step`, skipping the data from there through
  // the spike (PaLM): returns the step to continue from.
  auto roll_back = [&](int spike_step, const std::string& why) -> int {
    const int recent = rollbacks.RecentRollbacks(spike_step + 1, rs.rollback_window);
    if (recent >= rs.max_rollbacks)
      ThrowRuntime("step " + std::to_string(spike_step + 1) + ": " + why + "; " +
                   std::to_string(recent) + " rollback(s) within the last " +
                   std::to_string(rs.rollback_window) + " steps already ([resilience] " +
                   "max_rollbacks = " + std::to_string(rs.max_rollbacks) +
                   "): stopping; the data or the learning rate needs a look (RUN/rollbacks.json)");
    watchdog.Disarm();
    heartbeat.Set(spike_step, "resume");
    const data::LoaderState now = prefetch->state();
    std::optional<Resumed> r = ckpt.RollBack(state, spike_step);
    if (!r) {  // nothing to return to: this step's update is skipped instead, the data kept
      if (lead) {
        Log("keel: step %d: %s; no committed checkpoint to roll back to: the update is skipped "
            "(save more often: [checkpoint] every_steps)",
            spike_step + 1, why.c_str());
        events.Write({{"event", "spike_skip"}, {"step", spike_step + 1}, {"why", why}});
      }
      return -1;
    }
    const int to = int(r->step);
    step.Restored(r->state.at("optimizer").at("step").get<int>());
    const data::LoaderState then = data::LoaderStateFromJson(r->state.at("loader"));
    const int batches = int((now.position - then.position) / uint64_t(cfg.train.batch_size));
    rollbacks.Record(spike_step + 1, to, batches, why, lead);
    reposition(then);  // the loop's skip at `to` moves past the window
    restore_detectors(r->state);
    if (lead) {
      Log("keel: step %d: %s; rolled back to step %d and skipping the %d batch(es) from there "
          "through step %d",
          spike_step + 1, why.c_str(), to, batches, spike_step + 1);
      events.Write({{"event", "rollback"},
                    {"spike_step", spike_step + 1},
                    {"to_step", to},
                    {"skipped_batches", batches},
                    {"why", why}});
      KeepMetricsUpTo(sum.run_dir + "/metrics.jsonl", to);
      if (cfg.monitor.metrics_jsonl) metrics = monitor::JsonlWriter(sum.run_dir + "/metrics.jsonl");
    }
    sum.steps_done = to;
    return to;
  };

  StopScope stop;  // SIGINT/SIGTERM/SIGUSR2 from here on: finish the step, save, exit 0
  sum.steps_done = start_step;
  heartbeat.StartedAt(start_step);
  // The step's record: console, metrics.jsonl, Prometheus, [monitor.alerts] (rank 0's).
  StepReporter report(cfg, comm, cfg.train.stop_at > 0 ? cfg.train.stop_at : cfg.train.steps,
                      lead ? &events : nullptr,
                      std::filesystem::exists(ckpt.root()) ? ckpt.root() : sum.run_dir);
  ckpt.set_on_commit(report.CommitHook());
  for (int step_i = start_step; step_i < cfg.train.steps; ++step_i) {
    Timer step_timer;
    monitor::StepTimes times;
    using monitor::Phase;
    if (const int n = rollbacks.SkipAt(step_i)) skip_batches(step_i, n);
    watchdog.Arm(step_i);
    double data_ms = 0;
    hang_if_due(step_i, "data", step_i);
    hang_if_due(step_i, "forward", step_i);
    const bool spike_fault = faults.Take(resilience::FaultKind::kSpike, step_i) != nullptr;
    const bool nan_fault = faults.Take(resilience::FaultKind::kNanGrad, step_i) != nullptr;
    if (spike_fault || nan_fault)
      Log("keel: injected fault: rank %d, step %d: %s", comm.rank(), step_i + 1,
          spike_fault ? "a corrupted batch (targets spread over the vocabulary)" : "NaN gradients");
    const bool sdc_step = sdc_on && (step_i + 1) % rs.sdc_every == 0;
    std::vector<int32_t> kept;  // the step's micro-batches, for a re-run (silent-corruption check)
    const size_t rows = size_t(s.layout.micro_batch) * T;
    auto next = [&](int32_t* tok, int32_t* tgt) {
      const double waited = prefetch->Next(tok, tgt);
      if (spike_fault)  // garbage: targets spread over the whole vocabulary
        for (size_t i = 0; i < rows; ++i)
          tgt[i] = int32_t((i * 2654435761u + size_t(step_i)) % size_t(mcfg.vocab_size));
      if (sdc_step)
        kept.insert(kept.end(), tok, tok + rows), kept.insert(kept.end(), tgt, tgt + rows);
      return waited;
    };
    Timer fb_timer;
    double loss = step.ForwardBackward(s.layout.n_micro, next, nan_fault ? NAN : dloss, &data_ms) /
                  tokens_per_step;
    // Waiting for other stages is the pipeline's bubble; the backward phase is what the forward
    // and the waits leave of the pass (zeroing and accumulating the gradients included).
    times[Phase::kData] = data_ms;
    times[Phase::kForward] = step.forward_ms();
    times[Phase::kCommDp] = step.dp_wait_ms();
    times[Phase::kCommTp] = step.tp_wait_ms();
    times[Phase::kCommPp] = step.pp_wait_ms();
    times[Phase::kCommTied] = step.tied_wait_ms();
    const double backward_wait_ms = step.comm_wait_ms() + step.pp_wait_ms();
    double compute_ms = std::max(0.0, fb_timer.Millis() - data_ms - backward_wait_ms);
    if (const resilience::Fault* slow = faults.Take(resilience::FaultKind::kSlow, step_i)) {
      const double extra = (slow->factor - 1) * compute_ms;
      usleep(useconds_t(extra * 1e3));
      compute_ms += extra;
    }
    times[Phase::kBackward] = compute_ms - times[Phase::kForward];
    compute_since += compute_ms;
    hang_if_due(step_i, "backward", step_i);
    // The bubble as the last stage measured it, and the slowest stage's wait, for rank 0's log.
    double pipe[2] = {step.last_stage() ? step.bubble() : 0.0, step.pp_wait_ms()};
    if (pipelined) comm.AllReduceMax(pipe, 2);
    Timer checks_timer;
    if (sdc_step) {
      const ReplicaCheck check{step,
                               *groups.dp,
                               dims.zero,
                               comm.rank(),
                               dp_world_ranks,
                               hosts,
                               lead ? &events : nullptr};
      CheckReplicas(
          check, step_i + 1,
          [&] {  // after the repair: a persistent fault strikes again, and the step is re-run
            if (const auto* f = faults.Repeat(resilience::FaultKind::kBitflip, step_i))
              FlipBit(step, *f, comm.rank());
            size_t at = 0;
            auto replay = [&](int32_t* tok, int32_t* tgt) {  // host: token ids
              std::copy_n(kept.data() + at, rows, tok);
              std::copy_n(kept.data() + at + rows, rows, tgt);
              at += 2 * rows;
              return 0.0;
            };
            loss = step.ForwardBackward(s.layout.n_micro, replay, dloss) / tokens_per_step;
          },
          [&] { heartbeat.BlameSelf(); });
    }
    times[Phase::kChecks] = checks_timer.Millis();
    hang_if_due(step_i, "optimizer", step_i);
    Timer ot;
    const float lr = sched.At(step_i);
    const double norm = step.GradNorm();
    if (faults.Take(resilience::FaultKind::kKill, step_i)) {
      Log("keel: injected fault: rank %d is killed in step %d", comm.rank(), step_i + 1);
      std::fflush(nullptr);
      std::raise(SIGKILL);
    }
    // Every rank judges the same numbers (the loss and the norm are reduced), so every rank
    // skips or rolls back alike without a collective of its own.
    const StepJudge::Verdict verdict = judge.Judge(loss, norm);
    const bool nonfinite = verdict.nonfinite;
    if (nonfinite && rs.stop_on_nonfinite)
      ThrowRuntime("step " + std::to_string(step_i + 1) + ": the loss is " + std::to_string(loss) +
                   " and the gradient norm " + std::to_string(norm) +
                   "; stopping ([resilience] stop_on_nonfinite = true)");
    if (nonfinite && lead) {
      Log("keel: step %d: the loss is %g and the gradient norm %g; the update is skipped on "
          "every rank (%d in a row)",
          step_i + 1, loss, norm, verdict.in_a_row);
      events.Write({{"event", "nonfinite_skip"},
                    {"step", step_i + 1},
                    {"in_a_row", verdict.in_a_row},
                    {"loss_finite", std::isfinite(loss)}});
    }
    if (verdict.spike && !verdict.rollback && lead) {
      Log("keel: step %d: %s ([resilience] rollback = false: training on)", step_i + 1,
          verdict.spike->c_str());
      events.Write({{"event", "spike"}, {"step", step_i + 1}, {"why", *verdict.spike}});
    }
    const std::optional<std::string>& rollback_why = verdict.rollback;
    if (rollback_why) {
      if (const int to = roll_back(step_i, *rollback_why); to >= 0) {
        step_i = to - 1;
        continue;
      }
      judge.NoRollback();
    }
    const bool skip_update = nonfinite || rollback_why.has_value();
    const double ckpt_ms = ckpt.BeforeUpdate();  // a save in flight must have its snapshot first
    const double dp_before_update = step.dp_wait_ms();
    if (!skip_update) {
      step.Apply(lr, cfg.optim.grad_clip, norm);
      judge.Applied(loss, norm);
    }
    const double dp_in_update = step.dp_wait_ms() - dp_before_update;  // ZeRO's all-gathers
    if (const resilience::Fault* f = faults.Take(resilience::FaultKind::kBitflip, step_i))
      FlipBit(step, *f, comm.rank());
    const double optim_ms = ot.Millis() - ckpt_ms - dp_in_update;
    times[Phase::kOptimizer] = optim_ms;
    times[Phase::kCheckpoint] = ckpt_ms;
    times[Phase::kCommDp] += dp_in_update;
    sum.steps_done = step_i + 1;
    heartbeat.StepDone(step_i + 1);
    if (lead && step_i == start_step && s.dtype == DType::kBF16 && kernels::Bf16ProductsEmulated())
      Log("keel: this CPU has no bf16 matrix unit oneDNN can use; bf16 products run in fp32 "
          "(slower)");
    sum.last_loss = loss;
    checks_timer.Reset();
    std::string straggler;  // the line naming one, for the alert
    const std::vector<double> straggler_scores = CheckStragglers(
        stragglers, comm, compute_since, step_i + 1, rs, hosts, lead ? &events : nullptr,
        [&] { heartbeat.BlameSelf(); }, &straggler);
    if (!straggler_scores.empty()) compute_since = 0;
    times[Phase::kChecks] += checks_timer.Millis();
    double val = -1;
    const bool last_step = step_i + 1 == cfg.train.steps || step_i + 1 == cfg.train.stop_at;
    if (d.val_plan &&
        ((cfg.train.val_every > 0 && (step_i + 1) % cfg.train.val_every == 0) || last_step)) {
      heartbeat.Set(step_i + 1, "validate");
      const Timer val_timer;
      val = sum.val_loss = validate();
      times[Phase::kValidation] = val_timer.Millis();
      heartbeat.Set(step_i + 1, "train");
    }
    recent_losses.push_back(loss);
    if (recent_losses.size() > 64) recent_losses.erase(recent_losses.begin());
    auto view = [&] {
      ckpt::StateView v = state;
      v.step = step_i + 1;
      v.tokens = uint64_t(step_i + 1) * uint64_t(tokens_per_step);
      v.state = SavedState(cfg, s, step_i + 1, prefetch->state(), step.store().step(),
                           recent_losses, judge.ToJson());
      return v;
    };
    // Every rank agrees on stopping and saving at the same step, or the next collective hangs.
    std::optional<Error> data_error;
    try {
      prep->shard_check->ThrowIfFailed();
    } catch (const Error& e) {
      data_error = e;
    }
    if (faults.Take(resilience::FaultKind::kSigterm, step_i)) {
      Log("keel: injected fault: SIGTERM to rank %d after step %d", comm.rank(), step_i + 1);
      std::raise(SIGTERM);
    }
    hang_if_due(step_i, "checkpoint", step_i + 1);
    const double save_overlap_ms = ckpt.NoteStep(step_timer.Millis());
    const Timer save_timer;
    const StepDecision decision =
        ckpt.AfterStep(step_i + 1, last_step, stop.requested(), data_error.has_value(), view);
    times[Phase::kSync] = decision.agree_ms;
    times[Phase::kCheckpoint] += save_timer.Millis() - decision.agree_ms;
    heartbeat.Set(step_i + 1, "train");

    StepFigures fig;
    fig.step = step_i + 1;
    fig.loss = loss;
    fig.lr = lr;
    fig.grad_norm = norm;
    fig.val_loss = val;
    fig.tokens = tokens_per_step;
    fig.flops = flops_per_token * tokens_per_step;
    fig.peak_flops = peak;
    fig.skipped = skip_update;
    fig.straggler_checked = !straggler_scores.empty();
    fig.straggler = straggler;
    fig.ms = step_timer.Millis();
    fig.times = times;
    fig.times.CloseWith(fig.ms);
    nlohmann::json extra = {{"comm_wait_ms", step.comm_wait_ms()},
                            {"comm_bytes", step.comm_bytes()},
                            {"compute_ms", compute_ms},
                            {"memory_bytes", memory_total}};
    if (!straggler_scores.empty()) extra["straggler_scores"] = straggler_scores;
    if (ckpt_ms > 0) extra["ckpt_blocked_ms"] = ckpt_ms;
    if (save_overlap_ms >= 0) extra["save_overlap_ms"] = save_overlap_ms;
    if (pipelined) {
      extra["pp_wait_max_ms"] = pipe[1];
      extra["bubble"] = pipe[0];
      extra["bubble_predicted"] = bubble_predicted;
    }
    report.Report(fig, extra, lead && metrics.is_open() ? &metrics : nullptr);
    if (decision.failed) ShareError(comm, data_error);  // throws on every rank
    if (decision.stop) {
      sum.interrupted = true;
      if (lead) Log("keel: interrupted at step %d", step_i + 1);
      break;
    }
    if (step_i + 1 == cfg.train.stop_at) {  // stop_at > start_step, checked at resume
      if (lead) Log("keel: stopping at step %d ([train] stop_at)", step_i + 1);
      break;
    }
  }

  watchdog.Disarm();
  heartbeat.Set(sum.steps_done, "final");
  // Every rank takes part in gathering the weights; rank 0 writes them.
  const bool need_weights = cfg.checkpoint.save_final || !sum.interrupted;
  const std::vector<float> final_w = need_weights ? step.GatherWeights() : std::vector<float>();
  if (lead && cfg.checkpoint.save_final)
    ckpt::WriteModel(sum.run_dir + "/model.safetensors", mcfg, layout, final_w.data());
  if (lead && !sum.interrupted) PrintSamples(cfg, mcfg, layout, final_w.data());
  ckpt.Finish();  // after the model file: a failed last save must not cost the weights too
  // Lines of metrics or events that could not be written: the run's record is incomplete.
  std::string lost;
  for (const monitor::JsonlWriter* w : {&metrics, &events})
    if (w->failed_lines() > 0)
      lost += (lost.empty() ? "" : "; ") + std::to_string(w->failed_lines()) + " line(s) of " +
              w->path() + " (" + w->failure() + ")";
  if (!lost.empty())
    ThrowRuntime("the run trained to step " + std::to_string(sum.steps_done) +
                 " but its outputs are incomplete: could not write " + lost);
  return sum;
}

}  // namespace

TrainSummary Train(const RunConfig& cfg, parallel::Comm& comm) {
  // Under keel launch each rank beats into the folder the supervisor named, which watches it;
  // a run started by hand writes none.
  const char* dir = std::getenv("KEEL_HEARTBEAT_DIR");
  resilience::HeartbeatWriter heartbeat(dir ? dir : "", comm.rank(),
                                        dir && *dir ? cfg.launch.heartbeat_s : 0);
  try {
    TrainSummary s = TrainRun(cfg, comm, heartbeat);
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

#include "keel/train/trainer.h"

#include <omp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "keel/ckpt/checkpoint_model.h"
#include "keel/ckpt/model_file.h"
#include "keel/ckpt/model_source.h"
#include "keel/core/error.h"
#include "keel/core/log.h"
#include "keel/core/stop_signal.h"
#include "keel/core/timer.h"
#include "keel/data/dataset.h"
#include "keel/data/file_util.h"
#include "keel/data/loader.h"
#include "keel/data/prefetcher.h"
#include "keel/model/gpt.h"
#include "keel/monitor/flops.h"
#include "keel/monitor/jsonl.h"
#include "keel/optim/adamw.h"
#include "keel/optim/schedule.h"
#include "keel/train/checkpointing.h"
#include "keel/train/freeze.h"
#include "keel/train/grad_sync.h"
#include "keel/train/samples.h"

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
  data::WriteFileAtomic(path, kept);
}

struct Setup {
  model::ModelConfig mcfg;
  int local_batch, micro_batch, n_micro;
  DType dtype;
};

Setup Validate(const RunConfig& cfg, int world) {
  ValidateBatch(cfg, world);
  Setup s;
  s.mcfg = cfg.ResolvedModel();
  const TrainSection& t = cfg.train;
  s.local_batch = t.batch_size / world;
  s.micro_batch = t.micro_batch_size > 0 ? t.micro_batch_size : s.local_batch;
  s.n_micro = s.local_batch / s.micro_batch;
  s.dtype = t.precision == "fp32" ? DType::kF32 : DType::kBF16;
  if (cfg.data.train.empty() && cfg.data.sources.empty())
    ThrowBadInput("[data] train: expected a dataset path (or [[data.sources]]), got nothing");
  return s;
}

}  // namespace

TrainSummary Train(const RunConfig& cfg, parallel::Comm& comm) {
  const bool lead = comm.rank() == 0;
  const Setup s = Validate(cfg, comm.size());
  const int T = cfg.data.seq_len;
  const auto& mcfg = s.mcfg;

  // Everything that can be wrong with the input is found before the run directory exists.
  // `train = "path"` is a blend of one source with weight 1; it keeps the plain loader below, so
  // that its sample order (and every pinned loss) is exactly what it was before blending.
  std::vector<DataSource> sources = cfg.data.sources;
  if (sources.empty()) sources.push_back({cfg.data.train, 1.0});
  std::vector<data::TokenDataset> train_ds;
  train_ds.reserve(sources.size());  // the loader keeps pointers into it
  std::vector<const data::TokenDataset*> train_ptrs;
  std::vector<double> weights;
  for (const DataSource& src : sources) {
    train_ds.push_back(data::TokenDataset::Open(src.path));
    train_ds.back().CheckIds(mcfg.vocab_size);
    train_ptrs.push_back(&train_ds.back());
    weights.push_back(src.weight);
  }
  std::unique_ptr<data::TokenDataset> val_ds;
  if (!cfg.data.val.empty()) {
    val_ds = std::make_unique<data::TokenDataset>(data::TokenDataset::Open(cfg.data.val));
    val_ds->CheckIds(mcfg.vocab_size);
  }
  std::unique_ptr<data::BatchLoader> loader_ptr =
      train_ds.size() == 1
          ? std::make_unique<data::BatchLoader>(train_ds[0], T, cfg.train.batch_size, comm.rank(),
                                                comm.size(), cfg.train.seed, /*shuffle=*/true)
          : std::make_unique<data::BatchLoader>(train_ptrs, weights, T, cfg.train.batch_size,
                                                comm.rank(), comm.size(), cfg.train.seed);
  data::BatchLoader& loader = *loader_ptr;
  std::unique_ptr<data::BatchLoader> val_loader;
  if (val_ds)
    val_loader = std::make_unique<data::BatchLoader>(*val_ds, T, cfg.train.batch_size, comm.rank(),
                                                     comm.size(), cfg.train.seed, false);

  model::GptModel model(mcfg, s.dtype, s.micro_batch, T,
                        model::ParseRecompute(cfg.model.recompute));
  model::InitParams(model.layout(), mcfg, cfg.train.seed, model.master());
  if (!cfg.model.init_from.empty()) {  // fine-tuning: the file's weights replace the random ones
    ckpt::LoadInitWeights(cfg.model.init_from, mcfg, model.master());
    if (lead) Log("initialized the weights from %s", cfg.model.init_from.c_str());
  }
  model.SyncWorking();

  std::vector<optim::ParamRange> ranges;
  const std::vector<bool> frozen = FrozenParams(cfg.optim.freeze, model.layout());
  size_t n_frozen = 0;
  for (size_t i = 0; i < frozen.size(); ++i) {
    const auto& p = model.layout().params()[i];
    ranges.push_back({p.offset, p.numel, p.decay, frozen[i]});
    if (frozen[i]) n_frozen += p.numel;
  }
  if (lead && n_frozen)
    Log("keel: [optim] freeze: %zu of %zu parameters are not trained", n_frozen,
        model.layout().total());
  optim::AdamW opt(ranges, model.layout().total(),
                   {cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay});
  optim::LrSchedule sched{optim::LrSchedule::ParseKind(cfg.optim.schedule), cfg.optim.lr,
                          cfg.optim.min_lr, cfg.optim.warmup_steps, cfg.train.steps};
  GradSync sync(comm, model.grads(), model.layout().total(),
                size_t(cfg.parallel.bucket_mb * 1024 * 1024 / 4), cfg.parallel.comm_timeout_s);

  TrainSummary sum;
  sum.run_dir = (std::filesystem::path(cfg.train.out_dir) / cfg.train.name).string();
  monitor::JsonlWriter metrics, events;
  Checkpointer ckpt(cfg, comm, sum.run_dir, lead ? &events : nullptr);
  ckpt.CheckResumeRequest();  // a bad request fails here, before the run folder is touched
  if (lead) {
    std::filesystem::create_directories(sum.run_dir);
    std::ofstream(sum.run_dir + "/config.toml") << ToToml(cfg);
    events = monitor::JsonlWriter(sum.run_dir + "/events.jsonl");
    sum.unigram_entropy = UnigramEntropy(train_ptrs, weights);
  }

  // The state a checkpoint holds: fp32 master weights and both AdamW moments, tensor by tensor.
  ckpt::StateView state;
  state.tensors = ckpt::TensorSpecs(model.layout());
  state.buffers = {{"master", model.master()}, {"adam_m", opt.m()}, {"adam_v", opt.v()}};
  int start_step = 0;
  std::vector<double> recent_losses;  // the last few, for spike detection; kept across resumes
  if (auto r = ckpt.Resume(state)) {
    recent_losses = r->state.at("metrics").at("recent_losses").get<std::vector<double>>();
    start_step = int(r->step);
    model.SyncWorking();  // bf16 working weights: the rounding of the restored master, bit for bit
    opt.set_step(r->state.at("optimizer").at("step").get<int>());
    loader.restore(data::LoaderStateFromJson(r->state.at("loader")));
    sum.resumed_from = r->path;
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

  size_t matmul_params = model.layout().total() - model.layout().Find("wpe.weight").numel;
  const double flops_per_token =
      monitor::TrainFlopsPerToken(double(matmul_params), mcfg.n_layer, mcfg.n_embd, T);
  const int threads = omp_get_max_threads();
  const double peak = monitor::PeakFlops(s.dtype, threads, cfg.monitor.peak_gflops) * comm.size();
  const double tokens_per_step = double(cfg.train.batch_size) * T;
  const float dloss = float(1.0 / tokens_per_step);
  // What this rank allocated, by kind: the numbers `keel plan --accounting keel` predicts.
  const size_t n_params = model.layout().total();
  const nlohmann::json memory = {{"master", n_params * 4},
                                 {"working_bf16", model.working_bf16() ? n_params * 2 : 0},
                                 {"grads", n_params * 4},
                                 {"adam_moments", n_params * 8},
                                 {"activations", model.activation_plan().total_bytes}};
  size_t memory_total = 0;
  for (const auto& [kind, bytes] : memory.items()) memory_total += bytes.get<size_t>();
  if (lead) {
    Log("keel: %s %s, %zu parameters, %d rank(s) × %d thread(s), batch %d × %d tokens, "
        "%d micro-batch(es) of %d",
        cfg.model.name.c_str(), DTypeName(s.dtype), n_params, comm.size(), threads,
        cfg.train.batch_size, T, s.n_micro, s.micro_batch);
    Log("keel: memory per rank: master %.1f MiB, working bf16 %.1f, grads %.1f, AdamW moments "
        "%.1f, activations %.1f; total %.1f MiB",
        memory["master"].get<size_t>() / 1048576.0,
        memory["working_bf16"].get<size_t>() / 1048576.0, memory["grads"].get<size_t>() / 1048576.0,
        memory["adam_moments"].get<size_t>() / 1048576.0,
        memory["activations"].get<size_t>() / 1048576.0, memory_total / 1048576.0);
    events.Write({{"event", "memory"}, {"bytes", memory}});
  }
  if (lead) {
    // Which data the run draws from, with each source's share, so a log says what was trained.
    double total_weight = 0;
    for (double w : weights) total_weight += w;
    for (size_t i = 0; i < sources.size(); ++i)
      Log("keel: data source %zu: %s, weight %g (%.1f%%), %zu tokens", i, sources[i].path.c_str(),
          weights[i], 100 * weights[i] / total_weight, train_ds[i].size());
  }

  std::vector<int32_t> tokens(size_t(s.micro_batch) * T), targets(tokens.size());
  auto validate = [&]() {
    double total = 0;
    for (int b = 0; b < cfg.train.val_batches; ++b)
      for (int k = 0; k < s.n_micro; ++k) {
        val_loader->Fill(b, k, s.micro_batch, tokens.data(), targets.data());
        total += model.Forward(tokens.data(), targets.data());
      }
    return comm.AllReduceSum(total) / (tokens_per_step * cfg.train.val_batches);
  };

  // Micro-batches prepared ahead by a background thread; the loader belongs to it from here on.
  // The order is the loader's cursor order, i.e. exactly Fill(step, k) for k = 0..n_micro-1.
  data::Prefetcher prefetch(loader, s.micro_batch, cfg.data.prefetch);

  StopScope stop;  // SIGINT/SIGTERM from here on: finish the step, save, exit 0
  sum.steps_done = start_step;
  for (int step = start_step; step < cfg.train.steps; ++step) {
    Timer step_timer;
    double data_ms = 0;
    model.ZeroGrads();
    sync.Begin();
    double loss_sum = 0;
    for (int k = 0; k < s.n_micro; ++k) {
      data_ms += prefetch.Next(tokens.data(), targets.data());  // the time spent waiting
      const bool last = k == s.n_micro - 1;
      loss_sum += model.ForwardBackward(
          tokens.data(), targets.data(), dloss,
          last ? model::GradsReady([&](size_t off) { sync.Ready(off); }) : model::GradsReady());
    }
    sync.Finish();
    const double loss = comm.AllReduceSum(loss_sum) / tokens_per_step;
    if (!std::isfinite(loss) && cfg.resilience.stop_on_nonfinite)
      ThrowRuntime("step " + std::to_string(step) + ": the loss is " + std::to_string(loss) +
                   "; stopping (lower [optim] lr, or set [resilience] stop_on_nonfinite = false)");
    Timer ot;
    for (const auto& r : ranges)  // frozen parameters have no gradient, as in PyTorch
      if (r.frozen) std::fill_n(model.grads() + r.offset, r.numel, 0.0f);
    const double norm = optim::GlobalGradNorm(model.grads(), model.layout().total());
    const float lr = sched.At(step);
    const double ckpt_ms = ckpt.BeforeUpdate();  // a save in flight must have its snapshot
    opt.Step(model.master(), model.working_bf16(), model.grads(), lr,
             optim::ClipScale(norm, cfg.optim.grad_clip));
    const double optim_ms = ot.Millis();
    const double ms = step_timer.Millis();
    const double tok_s = tokens_per_step / (ms / 1e3);
    const double mfu = flops_per_token * tok_s / peak;
    sum.steps_done = step + 1;
    sum.last_loss = loss;
    double val = -1;
    const bool last_step = step + 1 == cfg.train.steps || step + 1 == cfg.train.stop_at;
    if (val_loader &&
        ((cfg.train.val_every > 0 && (step + 1) % cfg.train.val_every == 0) || last_step))
      val = sum.val_loss = validate();
    if (lead) {
      if (cfg.train.log_every > 0 && (step % cfg.train.log_every == 0 || last_step))
        std::printf(
            "step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | MFU %5.1f%% | "
            "%7.1f ms%s\n",
            step + 1, cfg.train.steps, loss, lr, norm, tok_s, 100 * mfu, ms,
            val >= 0 ? (" | val " + std::to_string(val).substr(0, 6)).c_str() : "");
      std::fflush(stdout);
      nlohmann::json m = {{"step", step + 1},
                          {"loss", loss},
                          {"lr", lr},
                          {"grad_norm", norm},
                          {"tokens_per_s", tok_s},
                          {"mfu", mfu},
                          {"ms", ms},
                          {"data_ms", data_ms},
                          {"comm_wait_ms", sync.wait_ms()},
                          {"optim_ms", optim_ms},
                          {"compute_ms", ms - data_ms - sync.wait_ms() - optim_ms},
                          {"memory_bytes", memory_total}};
      if (val >= 0) m["val_loss"] = val;
      if (ckpt_ms > 0) m["ckpt_blocked_ms"] = ckpt_ms;
      metrics.Write(m);
    }
    recent_losses.push_back(loss);
    if (recent_losses.size() > 64) recent_losses.erase(recent_losses.begin());
    auto view = [&] {
      ckpt::StateView v = state;
      v.step = step + 1;
      v.tokens = uint64_t(step + 1) * uint64_t(tokens_per_step);
      v.state = {{"config", ToToml(cfg)},
                 {"model", ckpt::ModelConfigToJson(mcfg)},
                 {"loader", data::ToJson(prefetch.state())},
                 {"optimizer", {{"kind", "adamw"}, {"step", opt.step()}}},
                 {"scheduler",
                  {{"kind", cfg.optim.schedule},
                   {"position", step + 1},
                   {"lr", cfg.optim.lr},
                   {"min_lr", cfg.optim.min_lr},
                   {"warmup_steps", cfg.optim.warmup_steps},
                   {"total_steps", cfg.train.steps}}},
                 {"rng", {{"kind", "counter"}, {"seed", cfg.train.seed}}},
                 {"loss_scaler", {{"kind", "none"}, {"scale", 1.0}}},
                 {"precision", cfg.train.precision},
                 {"metrics", {{"recent_losses", recent_losses}}}};
      return v;
    };
    // Every rank agrees on stopping and saving at the same step, or the next collective hangs.
    if (ckpt.AfterStep(step + 1, last_step, stop.requested(), view).stop) {
      sum.interrupted = true;
      if (lead) Log("keel: interrupted at step %d", step + 1);
      break;
    }
    if (step + 1 == cfg.train.stop_at) {
      if (lead) Log("keel: stopping at step %d ([train] stop_at)", step + 1);
      break;
    }
  }

  if (lead && cfg.checkpoint.save_final)
    ckpt::WriteModel(sum.run_dir + "/model.safetensors", mcfg, model.layout(), model.master());
  if (lead && !sum.interrupted) PrintSamples(cfg, mcfg, model.layout(), model.master());
  ckpt.Finish();  // after the model file: a failed last save must not cost the weights too
  return sum;
}

}  // namespace keel::train

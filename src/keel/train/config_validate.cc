// Range, enum and cross-key checks of a RunConfig (train/config.h), run by LoadConfig after the
// file and the --set overrides are applied, so that a value is checked whatever its source.
//
// Each check throws one line naming where the value came from (file and key, or --set flag), what
// was expected and what was found. Float checks are written as !(ok) so that NaN fails them.
#include <cmath>
#include <initializer_list>
#include <sstream>

#include "keel/core/error.h"
#include "keel/core/number_text.h"
#include "keel/core/validate.h"
#include "keel/kernels/backend.h"
#include "keel/train/config.h"
#include "keel/train/config_schema.h"

namespace keel::train {
namespace internal {
namespace {

class Checker {
 public:
  Checker(const Provenance& prov, std::string_view section) : prov_(prov), section_(section) {}

  void Positive(std::string_view key, int v) const {
    if (v <= 0) Fail(key, "expected an integer > 0, got " + std::to_string(v));
  }
  void NonNegative(std::string_view key, int v) const {
    if (v < 0) Fail(key, "expected an integer >= 0, got " + std::to_string(v));
  }
  template <typename T>
  void FinitePositive(std::string_view key, T v) const {
    if (!(std::isfinite(v) && v > 0))
      Fail(key, "expected a finite number > 0, got " + ShortestDecimal(v));
  }
  template <typename T>
  void FiniteNonNegative(std::string_view key, T v) const {
    if (!(std::isfinite(v) && v >= 0))
      Fail(key, "expected a finite number >= 0, got " + ShortestDecimal(v));
  }
  void UnitInterval(std::string_view key, float v) const {
    if (!(v >= 0 && v < 1)) Fail(key, "expected a number in [0, 1), got " + ShortestDecimal(v));
  }
  void NonEmpty(std::string_view key, const std::string& v) const {
    if (v.empty()) Fail(key, "expected a non-empty string");
  }
  void OneOf(std::string_view key, const std::string& v,
             std::initializer_list<std::string_view> allowed) const {
    std::string list;
    for (auto a : allowed) {
      if (v == a) return;
      list += (list.empty() ? "" : ", ") + std::string(a);
    }
    Fail(key, "expected one of " + list + "; got \"" + v + "\"");
  }
  [[noreturn]] void Fail(std::string_view key, const std::string& what) const {
    ThrowBadInput(prov_.Where(section_, key) + ": " + what);
  }

 private:
  const Provenance& prov_;
  std::string_view section_;
};

}  // namespace

model::ModelConfig ResolveModel(const ModelSection& m, const Provenance& prov) {
  try {
    model::ModelConfig c = model::NamedConfig(m.name);
    if (m.n_layer > 0) c.n_layer = m.n_layer;
    if (m.n_head > 0) c.n_head = m.n_head;
    if (m.n_embd > 0) c.n_embd = m.n_embd;
    if (m.vocab_size > 0) c.vocab_size = m.vocab_size;
    if (m.block_size > 0) c.block_size = m.block_size;
    if (m.n_kv_head > 0) c.n_kv_head = m.n_kv_head;
    if (m.ffn_hidden > 0) c.ffn_hidden = m.ffn_hidden;
    if (m.rope_theta > 0) c.rope_theta = m.rope_theta;
    model::Validate(c);
    return c;
  } catch (const Error& e) {
    // model/ names the key as "[model] KEY: ..."; say where that key was set. A shape check
    // can involve other keys (n_embd against n_head), so any [model] overrides are listed too.
    std::string msg = e.what();
    const std::string prefix = "[model] ";
    size_t colon = msg.find(": ");
    if (msg.rfind(prefix, 0) == 0 && colon != std::string::npos) {
      std::string key = msg.substr(prefix.size(), colon - prefix.size());
      msg = prov.Where("model", key) + msg.substr(colon);
    } else {
      msg = prov.File() + ": " + msg;
    }
    std::string overrides = prov.OverridesIn("model");
    if (!overrides.empty() && msg.rfind("--set ", 0) != 0) msg += " (after " + overrides + ")";
    ThrowBadInput(msg);
  }
}

void ValidateValues(const RunConfig& cfg, const Provenance& prov) {
  const Checker model(prov, "model");
  const ModelSection& m = cfg.model;
  // 0 means "as in the named config"; a negative shape is a typo, not a request.
  model.NonNegative("n_layer", m.n_layer);
  model.NonNegative("n_head", m.n_head);
  model.NonNegative("n_embd", m.n_embd);
  model.NonNegative("vocab_size", m.vocab_size);
  model.NonNegative("block_size", m.block_size);
  model.NonNegative("n_kv_head", m.n_kv_head);
  model.NonNegative("ffn_hidden", m.ffn_hidden);
  model.FiniteNonNegative("rope_theta", m.rope_theta);
  model.OneOf("recompute", m.recompute, {"none", "attn", "full"});
  model.FinitePositive("init_std", m.init_std);
  if (!m.init_adapter.empty() && m.init_from.empty())
    model.Fail("init_adapter", "an adapter is merged into [model] init_from's weights: set it too");

  const Checker lora(prov, "lora");
  lora.NonNegative("rank", cfg.lora.rank);
  lora.FiniteNonNegative("alpha", cfg.lora.alpha);
  lora.OneOf("base", cfg.lora.base, {"", "none", "int8", "nf4"});
  if (!(cfg.lora.dropout >= 0 && cfg.lora.dropout < 1))
    lora.Fail("dropout",
              "expected a probability in [0, 1), got " + ShortestDecimal(cfg.lora.dropout));
  if (cfg.lora.rank == 0 && cfg.lora.dropout > 0)
    lora.Fail("dropout", "drops the adapters' inputs; set [lora] rank too");
  if (cfg.lora.rank == 0 && cfg.lora.dora)
    lora.Fail("dora", "rescales the adapted products; set [lora] rank too");
  if (cfg.lora.rank == 0 && cfg.lora.base != "" && cfg.lora.base != "none")
    lora.Fail("base", "a quantized base is LoRA's frozen base; set [lora] rank too");

  const Checker data(prov, "data");
  data.Positive("seq_len", cfg.data.seq_len);
  data.Positive("prefetch", cfg.data.prefetch);
  if (!cfg.data.sources.empty() && !cfg.data.train.empty())
    data.Fail("sources", "set either [data] train or [[data.sources]], not both (train = \"" +
                             cfg.data.train + "\")");
  for (size_t i = 0; i < cfg.data.sources.size(); ++i) {
    const std::string entry = "sources[" + std::to_string(i) + "]";
    data.NonEmpty(entry + ".path", cfg.data.sources[i].path);
    data.FinitePositive(entry + ".weight", cfg.data.sources[i].weight);
  }

  const Checker train(prov, "train");
  const TrainSection& t = cfg.train;
  train.NonEmpty("name", t.name);
  // The run's folder is out_dir/name: a name that is a path could write anywhere.
  if (t.name.find('/') != std::string::npos || t.name == "." || t.name == "..")
    train.Fail("name", "\"" + t.name +
                           "\" is a path; expected a folder name inside train.out_dir (no '/', not "
                           "'.' or '..')");
  // It must also be a folder name on every file system a run folder may be copied to (NFS,
  // object stores, a laptop's): printable, none of \\:*?"<>|, no trailing dot or space, 255 bytes.
  for (const char c : t.name)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f ||
        std::string_view("\\:*?\"<>|").find(c) != std::string_view::npos)
      train.Fail("name", "contains " +
                             (static_cast<unsigned char>(c) < 0x20 || c == 0x7f
                                  ? "a control character (byte " + std::to_string(int(c)) + ")"
                                  : "'" + std::string(1, c) + "'") +
                             "; expected a folder name every file system takes (letters, digits, "
                             "'-', '_', '.')");
  if (t.name.size() > 255 || t.name.back() == '.' || t.name.back() == ' ')
    train.Fail("name", "\"" + t.name.substr(0, 64) +
                           "\": expected at most 255 bytes, not ending in '.' or ' '");
  train.NonEmpty("out_dir", t.out_dir);
  train.Positive("steps", t.steps);
  train.Positive("batch_size", t.batch_size);
  train.NonNegative("micro_batch_size", t.micro_batch_size);
  if (t.micro_batch_size > t.batch_size)
    train.Fail("micro_batch_size", "expected at most batch_size = " + std::to_string(t.batch_size) +
                                       ", got " + std::to_string(t.micro_batch_size));
  train.OneOf("precision", t.precision, {"bf16", "fp32", "fp16", "fp8"});
  train.OneOf("fp8_recipe", t.fp8_recipe, {"current", "delayed"});
  train.Positive("fp8_amax_history", t.fp8_amax_history);
  train.FiniteNonNegative("fp8_spike", t.fp8_spike);
  if (t.precision == "fp16") {
    // fp16 runs on the CPU backend, with an fp32 master and full weights.
    if (t.device != "cpu")
      train.Fail("precision",
                 "\"fp16\" runs on train.device = \"cpu\" only so far, got \"" + t.device + "\"");
    if (cfg.loss_scale.kind == "none")
      train.Fail("precision",
                 "\"fp16\" with [loss_scale] kind = \"none\": fp16's range (6e-5 to 65504) loses "
                 "small gradients without loss scaling; expected kind = \"auto\" or \"dynamic\"");
  }
  train.OneOf("device", t.device, {"cpu", "cuda"});
  if (t.device == "cuda" && !kernels::CudaBuilt())
    train.Fail("device",
               "\"cuda\", but this keel has no CUDA backend (no libkeel_cuda.so beside it: build "
               "where the CUDA toolkit and NCCL are installed, -DKEEL_CUDA=ON to insist); "
               "expected \"cpu\"");
  if (t.device == "cuda" && cfg.parallel.tp > 1)
    train.Fail("device",
               "\"cuda\" with parallel.tp = " + std::to_string(cfg.parallel.tp) +
                   ": tensor parallelism runs on the CPU backend only so far; expected tp = 1");
  train.NonNegative("val_every", t.val_every);
  train.NonNegative("val_batches", t.val_batches);
  train.Positive("log_every", t.log_every);
  train.NonNegative("sample_tokens", t.sample_tokens);
  train.NonNegative("sample_count", t.sample_count);
  train.NonNegative("stop_at", t.stop_at);

  const Checker optim(prov, "optim");
  const OptimSection& o = cfg.optim;
  optim.FinitePositive("lr", o.lr);
  optim.FiniteNonNegative("min_lr", o.min_lr);
  if (o.min_lr > o.lr)
    optim.Fail("min_lr", "expected at most lr = " + ShortestDecimal(o.lr) + ", got " +
                             ShortestDecimal(o.min_lr));
  optim.NonNegative("warmup_steps", o.warmup_steps);
  optim.OneOf("schedule", o.schedule, {"cosine", "linear", "constant"});
  optim.UnitInterval("beta1", o.beta1);
  optim.UnitInterval("beta2", o.beta2);
  optim.FinitePositive("eps", o.eps);
  optim.FiniteNonNegative("weight_decay", o.weight_decay);
  optim.FiniteNonNegative("grad_clip", o.grad_clip);
  optim.OneOf("state_dtype", o.state_dtype, {"fp32", "bf16"});
  if (!o.master_weights && t.precision != "bf16")
    optim.Fail("master_weights",
               "false needs train.precision = \"bf16\" (an fp32 run's weights "
               "are the master), got \"" +
                   t.precision + "\"");
  if (!o.master_weights && cfg.lora.rank > 0)
    optim.Fail("master_weights",
               "false is not for LoRA (its adapters' master is a few MB; the "
               "frozen base has none)");
  optim.OneOf("grad_dtype", o.grad_dtype, {"fp32", "bf16"});
  if (o.grad_dtype == "bf16") {
    if (t.precision == "fp32")
      optim.Fail("grad_dtype",
                 "\"bf16\" needs train.precision = \"bf16\" or \"fp16\" (an fp32 run keeps "
                 "fp32 gradients), got \"fp32\"");
    if (cfg.lora.rank > 0)
      optim.Fail("grad_dtype",
                 "\"bf16\" is not for LoRA (its gradients are the adapters' alone, a few MB)");
    if (t.device != "cpu")
      optim.Fail("grad_dtype",
                 "\"bf16\" runs on train.device = \"cpu\" only so far, got \"" + t.device + "\"");
  }

  const Checker scale(prov, "loss_scale");
  const LossScaleSection& ls = cfg.loss_scale;
  scale.OneOf("kind", ls.kind, {"auto", "none", "dynamic"});
  scale.FinitePositive("initial", float(ls.initial));
  scale.FinitePositive("min", float(ls.min));
  if (ls.min > ls.initial)
    scale.Fail("min", "expected at most initial = " + ShortestDecimal(float(ls.initial)) +
                          ", got " + ShortestDecimal(float(ls.min)));
  scale.Positive("growth_interval", ls.growth_interval);
  scale.Positive("hysteresis", ls.hysteresis);
  scale.NonNegative("switch_after", ls.switch_after);
  if (!(ls.growth >= 1 && ls.growth <= 1024))
    scale.Fail("growth",
               "expected a factor in [1, 1024], got " + ShortestDecimal(float(ls.growth)));
  if (!(ls.backoff > 0 && ls.backoff < 1))
    scale.Fail("backoff", "expected a factor in (0, 1), got " + ShortestDecimal(float(ls.backoff)));

  const Checker offload(prov, "offload");
  offload.FinitePositive("chunk_mib", float(cfg.offload.chunk_mib));
  if (!cfg.offload.dir.empty() && cfg.lora.rank > 0)
    offload.Fail("dir",
                 "is not for LoRA (its adapters' state is a few MB; the frozen base has none)");
  if (!cfg.offload.dir.empty() && t.device != "cpu")
    offload.Fail("dir",
                 "is built for train.device = \"cpu\" only (a GPU's tier is pinned host memory: "
                 "[offload] host = true), got \"" +
                     t.device + "\"");
  if (cfg.offload.params) {
    if (cfg.offload.dir.empty())
      offload.Fail("params", "needs [offload] dir (the weights' shard joins the disk tier)");
    if (cfg.parallel.zero != 3)
      offload.Fail("params",
                   "is for parallel.zero = 3 (below it every rank holds whole weights), "
                   "got zero = " +
                       std::to_string(cfg.parallel.zero));
    if (t.precision == "fp32")
      offload.Fail("params",
                   "needs train.precision = \"bf16\" or \"fp16\" (an fp32 run's "
                   "weights are its master, which stays in memory)");
  }
  if (cfg.offload.host) {
    if (!cfg.offload.dir.empty())
      offload.Fail("host",
                   "and dir are two tiers: set one (dir: a disk, host: a GPU's host memory)");
    if (t.device != "cuda")
      offload.Fail("host",
                   "is for train.device = \"cuda\" (on the CPU the state is in host memory "
                   "already; [offload] dir moves it to a disk), got \"" +
                       t.device + "\"");
    if (t.precision != "bf16")
      offload.Fail("host", "needs train.precision = \"bf16\" (the GPU keeps bf16 weights), got \"" +
                               t.precision + "\"");
    if (cfg.lora.rank > 0)
      offload.Fail("host", "is not for LoRA (its adapters' state is a few MB)");
  }

  const Checker parallel(prov, "parallel");
  parallel.FinitePositive("bucket_mb", cfg.parallel.bucket_mb);
  parallel.FinitePositive("comm_timeout_s", cfg.parallel.comm_timeout_s);
  parallel.OneOf("grad_comm", cfg.parallel.grad_comm, {"fp32", "bf16", "int8"});
  if (cfg.parallel.grad_comm != "fp32" && t.device == "cuda")
    parallel.Fail("grad_comm",
                  "\"" + cfg.parallel.grad_comm +
                      "\" is built for CPU runs (its encoding runs on the host); on a GPU the "
                      "gradients travel in fp32 through NCCL");

  parallel.OneOf("cp_comm", cfg.parallel.cp_comm, {"ring", "allgather"});
  if (cfg.parallel.cp > 1) {
    // What context parallelism's first version composes with, each one line here.
    auto refuse = [&](bool when, const std::string& why) {
      if (when) parallel.Fail("cp", std::to_string(cfg.parallel.cp) + " " + why);
    };
    refuse(t.device == "cuda", "runs on train.device = \"cpu\" only so far");
    refuse(cfg.parallel.dp_sync == "diloco",
           "is not for DiLoCo yet (its replicas would be the cp ranks' parts)");
    refuse(cfg.lora.dropout > 0,
           "is not for LoRA dropout yet (its masks are drawn per position of a whole row)");
  }
  parallel.OneOf("dp_sync", cfg.parallel.dp_sync, {"step", "diloco"});
  if (cfg.parallel.dp_sync == "diloco") {
    // What DiLoCo's first version composes with; each is one line here rather than a wrong run.
    auto refuse = [&](bool when, const std::string& why) {
      if (when) parallel.Fail("dp_sync", "\"diloco\" " + why);
    };
    refuse(cfg.parallel.zero != 0, "keeps a whole replica per rank: needs parallel.zero = 0, got " +
                                       std::to_string(cfg.parallel.zero));
    refuse(cfg.parallel.tp > 1 || cfg.parallel.pp > 1,
           "runs data parallelism alone so far: needs parallel.tp = parallel.pp = 1");
    refuse(cfg.lora.rank > 0, "is not for LoRA yet");
    refuse(!cfg.offload.dir.empty() || cfg.offload.host,
           "keeps its state in memory: not with [offload]");
    refuse(!cfg.optim.master_weights || cfg.optim.state_dtype != "fp32" ||
               cfg.optim.grad_dtype != "fp32",
           "needs the fp32 master and state (optim.master_weights, state_dtype, grad_dtype)");
    refuse(t.precision == "fp16", "does not take fp16's loss scaling yet: use bf16 or fp32");
    refuse(t.device == "cuda", "is built for CPU runs");
  }
  const Checker diloco(prov, "diloco");
  if (cfg.parallel.dp_sync != "diloco" && !(cfg.diloco == DilocoSection{})) {
    const DilocoSection d;
    diloco.Fail(cfg.diloco.inner_steps != d.inner_steps         ? "inner_steps"
                : cfg.diloco.outer_lr != d.outer_lr             ? "outer_lr"
                : cfg.diloco.outer_momentum != d.outer_momentum ? "outer_momentum"
                : cfg.diloco.fragments != d.fragments           ? "fragments"
                                                                : "overlap_steps",
                "is DiLoCo's; set [parallel] dp_sync = \"diloco\" too");
  }
  diloco.Positive("inner_steps", cfg.diloco.inner_steps);
  diloco.FinitePositive("outer_lr", cfg.diloco.outer_lr);
  if (!(cfg.diloco.outer_momentum >= 0 && cfg.diloco.outer_momentum < 1))
    diloco.Fail("outer_momentum",
                "expected a number in [0, 1), got " + std::to_string(cfg.diloco.outer_momentum));
  if (cfg.diloco.inner_steps > 0) {
    const auto [key, what] = DilocoScheduleProblem(cfg.diloco.inner_steps, cfg.diloco.fragments,
                                                   cfg.diloco.overlap_steps);
    if (!key.empty()) diloco.Fail(key, what);
  }

  const Checker ckpt(prov, "checkpoint");
  const CheckpointSection& k = cfg.checkpoint;
  ckpt.NonNegative("every_steps", k.every_steps);
  ckpt.FiniteNonNegative("every_minutes", k.every_minutes);
  ckpt.Positive("keep_last", k.keep_last);
  ckpt.NonNegative("keep_every", k.keep_every);
  ckpt.OneOf("if_busy", k.if_busy, {"wait", "skip"});
  ckpt.NonNegative("peer_every", k.peer_every);
  ckpt.FiniteNonNegative("peer_rate_mbit", k.peer_rate_mbit);
  if (k.peer_every > 0 && !cfg.offload.dir.empty())
    ckpt.Fail("peer_every",
              "tier-0 copies are sent from memory, and [offload] dir keeps part of "
              "the state on disk; set peer_every = 0 or drop the offload tier");
  if (k.writer_nice < 0 || k.writer_nice > 19)
    ckpt.Fail("writer_nice",
              "expected a nice value 0..19 (19: the writer runs when the step's "
              "threads leave a core free), got " +
                  std::to_string(k.writer_nice));

  const Checker monitor(prov, "monitor");
  monitor.FiniteNonNegative("peak_gflops", cfg.monitor.peak_gflops);
  monitor.NonNegative("metrics_port", cfg.monitor.metrics_port);
  if (cfg.monitor.metrics_port > 65535)
    monitor.Fail("metrics_port", "expected a TCP port, 1 to 65535 (0: no endpoint), got " +
                                     std::to_string(cfg.monitor.metrics_port));
  CheckListenAddress(prov.Where("monitor", "metrics_addr"), cfg.monitor.metrics_addr);
  if (cfg.monitor.metrics_port > 0 && !IsLoopbackAddress(cfg.monitor.metrics_addr) &&
      cfg.monitor.metrics_token.empty())
    monitor.Fail("metrics_addr",
                 "\"" + cfg.monitor.metrics_addr +
                     "\" is reachable from other machines: set [monitor] metrics_token too "
                     "(scrapers then send it as the basic-auth password of user \"keel\")");

  const Checker alerts(prov, "monitor.alerts");
  const AlertsSection& al = cfg.monitor.alerts;
  for (const auto& [key, v] : {std::pair{"loss_ceiling", al.loss_ceiling},
                               {"no_step_s", al.no_step_s},
                               {"checkpoint_age_min", al.checkpoint_age_min},
                               {"min_free_disk_gb", al.min_free_disk_gb}})
    alerts.FiniteNonNegative(key, v);
  if (!(al.throughput_drop >= 0 && al.throughput_drop < 1))
    alerts.Fail("throughput_drop",
                "expected a fraction in [0, 1) (0.3: alert 30% below the "
                "running median; 0: off), got " +
                    std::to_string(al.throughput_drop));
  if (!al.webhook.empty()) CheckHttpUrl(prov.Where("monitor.alerts", "webhook"), al.webhook);

  const Checker res(prov, "resilience");
  const ResilienceSection& r = cfg.resilience;
  for (const auto& [key, v] : {std::pair{"max_skips", r.max_skips},
                               {"spike_window", r.spike_window},
                               {"spike_min_steps", r.spike_min_steps},
                               {"max_rollbacks", r.max_rollbacks},
                               {"rollback_window", r.rollback_window},
                               {"straggler_checks", r.straggler_checks}})
    res.Positive(key, v);
  res.NonNegative("sdc_every", r.sdc_every);
  res.NonNegative("straggler_every", r.straggler_every);
  for (const auto& [key, v] : {std::pair{"spike_z", r.spike_z},
                               {"spike_ratio", r.spike_ratio},
                               {"straggler_ratio", r.straggler_ratio}})
    res.FinitePositive(key, v);
  res.FiniteNonNegative("norm_spike_ratio", r.norm_spike_ratio);
  res.FiniteNonNegative("hang_timeout_s", r.hang_timeout_s);
  if (r.spike_min_steps > r.spike_window)
    res.Fail("spike_min_steps",
             std::to_string(r.spike_min_steps) + " is more than spike_window = " +
                 std::to_string(r.spike_window) + ": no verdict would ever come");
  if (!ParseSkipBatches(r.skip_batches))
    res.Fail("skip_batches",
             "expected \"STEP:COUNT\" entries separated by commas (whole numbers, "
             "COUNT >= 1, each STEP once), got \"" +
                 r.skip_batches + "\"");

  const Checker launch(prov, "launch");
  const LaunchSection& l = cfg.launch;
  launch.OneOf("launcher", l.launcher, {"auto", "local", "mpirun", "slurm"});
  launch.NonNegative("ranks_per_host", l.ranks_per_host);
  launch.NonNegative("max_restarts", l.max_restarts);
  launch.NonNegative("window_failures", l.window_failures);
  launch.Positive("host_failures", l.host_failures);
  for (const auto& [key, v] : {std::pair{"backoff_s", l.backoff_s},
                               {"backoff_max_s", l.backoff_max_s},
                               {"window_minutes", l.window_minutes},
                               {"heartbeat_timeout_s", l.heartbeat_timeout_s},
                               {"health_min_free_gb", l.health_min_free_gb},
                               {"health_min_gflops", l.health_min_gflops},
                               {"regrow_minutes", l.regrow_minutes},
                               {"holder_memory_gb", l.holder_memory_gb}})
    launch.FiniteNonNegative(key, v);
  if (l.holder_port < 1 || l.holder_port > 65535)
    launch.Fail("holder_port",
                "expected a TCP port, 1 to 65535, got " + std::to_string(l.holder_port));
  for (const auto& [key, v] : {std::pair{"heartbeat_s", l.heartbeat_s},
                               {"health_timeout_s", l.health_timeout_s},
                               {"stop_grace_s", l.stop_grace_s}})
    launch.FinitePositive(key, v);
  if (l.heartbeat_timeout_s > 0 && l.heartbeat_timeout_s < 2 * l.heartbeat_s)
    launch.Fail("heartbeat_timeout_s",
                ShortestDecimal(l.heartbeat_timeout_s) +
                    " is shorter than two beats (heartbeat_s = " + ShortestDecimal(l.heartbeat_s) +
                    "): a healthy rank would be taken for silent");

  // Cross-section: a sample longer than the position embedding has no positions to use.
  model::ModelConfig resolved = ResolveModel(m, prov);
  if (cfg.data.seq_len > resolved.block_size)
    data.Fail("seq_len", std::to_string(cfg.data.seq_len) + " is longer than block_size " +
                             std::to_string(resolved.block_size) + " of model \"" + m.name + "\"");
}

}  // namespace internal

std::pair<std::string, std::string> DilocoScheduleProblem(int inner_steps, int fragments,
                                                          int overlap_steps) {
  const std::string h = std::to_string(inner_steps);
  if (!(fragments >= 1 && fragments <= inner_steps))
    return {"fragments", "expected an integer in [1, inner_steps = " + h + "], got " +
                             std::to_string(fragments)};
  if (!(overlap_steps >= 0 && overlap_steps < inner_steps))
    return {"overlap_steps", "expected an integer in [0, inner_steps = " + h + "), got " +
                                 std::to_string(overlap_steps) +
                                 " (a fragment lands before its next round ends)"};
  return {};
}

model::ModelConfig RunConfig::ResolvedModel() const {
  const internal::Provenance prov(source);
  model::ModelConfig m = internal::ResolveModel(model, prov);
  if (lora.rank <= 0) return m;
  m.lora_rank = lora.rank;
  m.lora_alpha = lora.alpha > 0 ? lora.alpha : 2.0f * float(lora.rank);
  m.lora_targets = model::ParseLoraTargets(
      m.llama(), lora.targets.empty() ? (m.llama() ? "qkv" : "c_attn") : lora.targets,
      prov.Where("lora", "targets"));
  m.lora_base = model::ParseBaseQuant(lora.base, prov.Where("lora", "base"));
  m.lora_dropout = lora.dropout;
  m.lora_dora = lora.dora;
  return m;
}

}  // namespace keel::train

namespace keel::train {

std::optional<std::map<int, int>> ParseSkipBatches(const std::string& text) {
  std::map<int, int> skips;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    int step = -1, count = 0;
    char colon = 0, extra = 0;
    std::stringstream one(item);
    if (!(one >> step >> colon >> count) || colon != ':' || (one >> extra) || step < 0 ||
        count < 1 || skips.count(step))
      return std::nullopt;
    skips[step] = count;
  }
  return skips;
}

}  // namespace keel::train

// keel plan: rank every parallel layout of a model on a cluster by estimated tokens/s, with the
// memory per accelerator broken down and the layouts that do not fit rejected with the reason.
// The models live in keel/plan; this file only reads the request and prints the answer.
#include <omp.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "keel/cli/plan_output.h"
#include "keel/cli/verbs.h"
#include "keel/core/dtype.h"
#include "keel/core/error.h"
#include "keel/model/config.h"
#include "keel/plan/search.h"
#include "keel/train/config.h"

namespace keel::cli {

namespace {

struct PlanArgs {
  std::string config, model, precision = "bf16", accounting, accel = "H100-80GB";
  std::string recompute = "any", sp = "any", lora_targets;
  int lora_rank = 0;
  std::string lora_base, state_dtype = "fp32", grad_dtype = "fp32", grad_comm = "fp32";
  int diloco_inner_steps = 0;
  int diloco_fragments = 1;
  int diloco_overlap_steps = 0;
  bool lora_dora = false, no_master = false, offload = false, offload_host = false,
       offload_params = false;
  // 0: 2 for a disk, the accelerator's host link (--host-gbps) for the host tier.
  double offload_chunk_mib = 16, offload_gbps = 0;
  int layers = 0, hidden = 0, heads = 0, vocab = 0, seq = 0;
  int global_batch = 512, world = 8, per_node = 8, top = 10;
  int tp = -1, pp = -1, dp = -1, zero = -1, micro_batch = -1, virtual_stages = 1, cp = -1;
  std::string cp_comm = "ring";
  double tflops = 0, fp32_tflops = 0, memory_gb = 0, hbm_gbps = 0, intra_gbps = 0, inter_gbps = 0;
  double efficiency = -1;  // not given: plan::DefaultEfficiency for the accelerator and precision
  double node_mtbf_hours = 6000, storage_gbps = 0, restart_minutes = 10, price_per_hour = 0;
  double tokens = 0, host_gbps = 0;
  bool json = false, explain = false;
};

// Fills the options not given on the command line from a TOML file: keys are the long flag names
// (dashes or underscores), at the top level or in any table ([model], [cluster], [layout]).
void ApplyToml(CLI::App* cmd, const std::string& path) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    ThrowBadInput(path + ": " + std::string(e.description()));
  }
  std::function<void(const toml::table&, const std::string&)> walk = [&](const toml::table& t,
                                                                         const std::string& where) {
    for (const auto& [k, v] : t) {
      std::string key(k.str());
      if (const auto* sub = v.as_table()) {
        walk(*sub, key);
        continue;
      }
      for (auto& c : key)
        if (c == '_') c = '-';
      CLI::Option* opt = nullptr;
      try {
        opt = cmd->get_option("--" + key);
      } catch (const CLI::Error&) {
      }
      if (!opt || key == "config")
        ThrowBadInput(path + ": unknown key \"" + (where.empty() ? "" : where + ".") +
                      std::string(k.str()) + "\" (keys are keel plan's long flag names)");
      if (opt->count() > 0) continue;  // the command line wins
      std::string value;
      if (auto s = v.value<std::string>())
        value = *s;
      else if (auto i = v.value<int64_t>())
        value = std::to_string(*i);
      else if (auto d = v.value<double>())
        value = std::to_string(*d);
      else if (auto b = v.value<bool>())
        value = *b ? "true" : "false";
      else
        ThrowBadInput(path + ": key \"" + key + "\": expected a string, number or boolean");
      opt->add_result(value);
      try {
        opt->run_callback();
      } catch (const CLI::ParseError& e) {
        ThrowBadInput(path + ": key \"" + key + "\": " + e.what());
      }
    }
  };
  walk(root, "");
}

plan::Job MakeJob(const PlanArgs& a) {
  plan::Job job;
  if (!a.model.empty()) {
    job.model = plan::NamedModel(a.model);
  } else if (a.layers == 0 && a.hidden == 0) {
    ThrowBadInput("plan: give --model NAME or --layers/--hidden/--heads (see keel help plan)");
  }
  const plan::ModelSpec named = job.model;
  if (a.layers) job.model.layers = a.layers;
  if (a.hidden) job.model.hidden = a.hidden;
  if (a.heads) job.model.heads = a.heads;
  if (a.vocab) job.model.vocab = a.vocab;
  if (a.seq) job.model.seq = a.seq;
  if (a.model.empty() || job.model.layers != named.layers || job.model.hidden != named.hidden ||
      job.model.heads != named.heads || job.model.vocab != named.vocab ||
      job.model.seq != named.seq)
    job.model.name = a.model.empty() ? "custom" : a.model + " (modified)";
  plan::ValidateModel(job.model);
  if (a.lora_rank < 0)
    ThrowBadInput("plan: --lora-rank " + std::to_string(a.lora_rank) + ": expected >= 0");
  if (a.lora_rank > 0) {
    const bool llama = job.model.family == model::Family::kLlama;
    job.model.lora_rank = a.lora_rank;
    job.model.lora_targets = model::ParseLoraTargets(
        llama, a.lora_targets.empty() ? (llama ? "qkv" : "c_attn") : a.lora_targets,
        "plan: --lora-targets");
    job.model.lora_base = model::ParseBaseQuant(a.lora_base, "plan: --lora-base");
    job.model.lora_dora = a.lora_dora;
    model::Validate(plan::ToModelConfig(job.model));  // nf4's blocks of 64, say
  } else if (a.lora_dora) {
    ThrowBadInput("plan: --lora-dora without --lora-rank");
  } else if (!a.lora_targets.empty() || !a.lora_base.empty()) {
    ThrowBadInput(std::string("plan: ") + (a.lora_base.empty() ? "--lora-targets" : "--lora-base") +
                  " without --lora-rank");
  }
  job.precision = plan::ParsePrecision(a.precision);
  if (a.state_dtype != "fp32" && a.state_dtype != "bf16")
    ThrowBadInput("plan: --state-dtype \"" + a.state_dtype + "\": expected fp32 or bf16");
  job.bf16_moments = a.state_dtype == "bf16";
  job.master = !a.no_master;
  if (a.grad_dtype != "fp32" && a.grad_dtype != "bf16")
    ThrowBadInput("plan: --grad-dtype \"" + a.grad_dtype + "\": expected fp32 or bf16");
  job.bf16_grads = a.grad_dtype == "bf16";
  const auto wire = parallel::ParseGradWire(a.grad_comm);
  if (!wire)
    ThrowBadInput("plan: --grad-comm \"" + a.grad_comm + "\": expected fp32, bf16 or int8");
  job.grad_comm = *wire;
  if (a.diloco_inner_steps < 0)
    ThrowBadInput("plan: --diloco-inner-steps " + std::to_string(a.diloco_inner_steps) +
                  ": expected >= 0 (0: synchronous)");
  job.diloco_inner_steps = a.diloco_inner_steps;
  if (a.diloco_fragments != 1 || a.diloco_overlap_steps != 0) {
    if (a.diloco_inner_steps <= 0)
      ThrowBadInput(
          "plan: --diloco-fragments and --diloco-overlap-steps need --diloco-inner-steps");
    auto [key, what] = train::DilocoScheduleProblem(a.diloco_inner_steps, a.diloco_fragments,
                                                    a.diloco_overlap_steps);
    if (!key.empty()) {
      std::replace(key.begin(), key.end(), '_', '-');
      ThrowBadInput("plan: --diloco-" + key + ": " + what);
    }
    job.diloco_streaming = true;
  }
  if (job.bf16_grads && (job.precision != plan::Precision::kBf16 || a.lora_rank > 0))
    ThrowBadInput(std::string("plan: --grad-dtype bf16: ") +
                  (a.lora_rank > 0 ? "not with --lora-rank (the adapters' gradients are small)"
                                   : "needs --precision bf16 (an fp32 run keeps fp32 gradients)"));
  if (a.no_master && (job.precision != plan::Precision::kBf16 || a.lora_rank > 0))
    ThrowBadInput(std::string("plan: --no-master: ") +
                  (a.lora_rank > 0 ? "not with --lora-rank (the adapters' master is small)"
                                   : "needs --precision bf16 (fp32 weights are the master)"));
  if (a.offload && a.offload_host)
    ThrowBadInput("plan: --offload and --offload-host are two tiers: give one");
  if (a.offload || a.offload_host) {
    const char* flag = a.offload ? "--offload" : "--offload-host";
    if (a.lora_rank > 0)
      ThrowBadInput(std::string("plan: ") + flag +
                    ": not with --lora-rank (the adapters' state is small)");
    if (a.offload_host && job.precision != plan::Precision::kBf16)
      ThrowBadInput("plan: --offload-host: needs --precision bf16 (the GPU keeps bf16 weights)");
    if (!(a.offload_chunk_mib > 0) || !(a.offload_gbps >= 0))
      ThrowBadInput("plan: --offload-chunk-mib and --offload-gbps: expected positive numbers");
    job.offload_chunk = a.offload_chunk_mib * 1048576;
    job.offload_host = a.offload_host;
  }
  if (a.offload_params) {
    if (!a.offload)
      ThrowBadInput("plan: --offload-params: needs --offload (the weights' shard joins its tier)");
    if (job.precision == plan::Precision::kFp32)
      ThrowBadInput(
          "plan: --offload-params: needs a 16-bit --precision (an fp32 run's ZeRO 3 "
          "shard is its master)");
    if (a.zero != -1 && a.zero != 3)
      ThrowBadInput(
          "plan: --offload-params: is for --zero 3 (below it every rank holds whole "
          "weights), got --zero " +
          std::to_string(a.zero));
    job.offload_params = true;
  }
  // keel's accounting is the only one that knows LoRA's compact state: it is LoRA's default.
  job.accounting = plan::ParseAccounting(!a.accounting.empty() ? a.accounting
                                         : a.lora_rank > 0     ? "keel"
                                                               : "paper");
  if (a.lora_rank > 0 && job.accounting != plan::Accounting::kKeel)
    ThrowBadInput("plan: --lora-rank: the paper accounting has no LoRA; use --accounting keel");
  job.global_batch = a.global_batch;
  if (a.efficiency != -1 && !(a.efficiency > 0 && a.efficiency <= 1)) {
    char num[32];
    std::snprintf(num, sizeof(num), "%g", a.efficiency);
    ThrowBadInput(std::string("plan: --efficiency ") + num + " not in (0, 1]");
  }
  job.cluster.world = a.world;
  job.cluster.per_node = a.per_node;
  job.cluster.accel = a.accel == "this-cpu" ? MeasureThisCpu() : plan::NamedAccelerator(a.accel);
  plan::Accelerator& acc = job.cluster.accel;
  if (a.accel == "this-cpu" && a.efficiency == -1) MeasureKernels(job, a.micro_batch);
  job.efficiency = a.efficiency != -1
                       ? a.efficiency
                       : plan::DefaultEfficiency(acc, job.precision == plan::Precision::kFp32);
  if (a.tflops > 0) acc.bf16_flops = a.tflops * 1e12;
  if (a.fp32_tflops > 0) acc.fp32_flops = a.fp32_tflops * 1e12;
  if (a.memory_gb > 0) acc.memory_bytes = a.memory_gb * 1e9;
  if (a.hbm_gbps > 0) acc.hbm_bytes_per_s = a.hbm_gbps * 1e9;
  if (a.intra_gbps > 0) acc.intra_bytes_per_s = a.intra_gbps * 1e9;
  if (a.inter_gbps > 0) acc.inter_bytes_per_s = a.inter_gbps * 1e9;
  if (a.host_gbps > 0) acc.host_bytes_per_s = a.host_gbps * 1e9;
  // The tier's link: as given, else the host tier's is the accelerator's (the disk's: Job's 2
  // GB/s).
  if (a.offload_gbps > 0)
    job.offload_bytes_per_s = a.offload_gbps * 1e9;
  else if (job.offload_host)
    job.offload_bytes_per_s = acc.host_bytes_per_s;
  auto positive = [](const char* flag, double v, bool zero_ok) {
    if (v > 0 || (zero_ok && v == 0)) return;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%g", v);
    ThrowBadInput(std::string("plan: ") + flag + " " + buf + ": expected " +
                  (zero_ok ? ">= 0" : "> 0"));
  };
  positive("--node-mtbf-hours", a.node_mtbf_hours, false);
  positive("--storage-gbps", a.storage_gbps, true);
  positive("--restart-minutes", a.restart_minutes, true);
  positive("--price-per-hour", a.price_per_hour, true);
  positive("--tokens", a.tokens, true);
  job.run.node_mtbf_hours = a.node_mtbf_hours;
  job.run.storage_bytes_per_s = a.storage_gbps * 1e9;
  job.run.restart_s = a.restart_minutes * 60;
  job.run.price_per_hour = a.price_per_hour;
  job.run.tokens = a.tokens;
  return job;
}

plan::Constraints MakeConstraints(const PlanArgs& a) {
  plan::Constraints c{a.tp, a.pp, a.dp, a.zero, a.micro_batch, -1, a.virtual_stages, {}, a.cp};
  // -1 is "not given"; anything else below 1 (below 0 for ZeRO) is a mistake, not "any".
  const std::pair<const char*, int> fixed[] = {{"--tp", a.tp},
                                               {"--pp", a.pp},
                                               {"--dp", a.dp},
                                               {"--micro-batch", a.micro_batch},
                                               {"--cp", a.cp}};
  for (const auto& [flag, v] : fixed)
    if (v != -1 && v < 1)
      ThrowBadInput(std::string("plan: ") + flag + " " + std::to_string(v) + ": expected >= 1");
  if (a.zero != -1 && (a.zero < 0 || a.zero > 3))
    ThrowBadInput("plan: --zero " + std::to_string(a.zero) + ": expected 0, 1, 2 or 3");
  if (a.sp == "on")
    c.sp = 1;
  else if (a.sp == "off")
    c.sp = 0;
  else if (a.sp != "any")
    ThrowBadInput("plan: --sp: expected on, off or any, got \"" + a.sp + "\"");
  if (a.recompute != "any") c.recompute = {plan::ParseRecompute(a.recompute)};
  if (a.cp_comm == "allgather")
    c.cp_comm = parallel::CpComm::kAllGather;
  else if (a.cp_comm != "ring")
    ThrowBadInput("plan: --cp-comm: expected ring or allgather, got \"" + a.cp_comm + "\"");
  return c;
}

}  // namespace

void RegisterPlan(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "Rank parallel layouts: memory, communication, time");
  cmd->footer(
      "Examples:\n"
      "  keel plan --model 175B --accelerator H100-80GB --accelerators 1024 --global-batch 1536\n"
      "  keel plan --model 7B --accelerators 64 --zero 3 --json\n"
      "  keel plan --model 175B --accelerators 64 --tp 8 --pp 8 --dp 1 --micro-batch 1 "
      "--recompute selective --sp on --explain\n"
      "  keel plan --model gpt2 --accelerators 1 --accounting keel   (keel's own arena)\n"
      "  keel plan --model 175B --accelerators 1024 --node-mtbf-hours 6000 --storage-gbps 200 "
      "--price-per-hour 2.5\n"
      "  keel plan --config plan.toml --accelerators 256   (TOML keys: the long flag names)\n"
      "Models: 6N + 12Lhs FLOPs/token (PaLM), activations per Korthikanti et al. 2022, ZeRO\n"
      "stages per Rajbhandari et al. 2020; see docs/PLAN.md.");
  static PlanArgs a;
  cmd->add_option("--config", a.config, "TOML file with any of these options");
  cmd->add_option("--model", a.model, "gpt2-tiny..gpt2-xl, 7B, 13B, 22B, 175B, 530B, 1T");
  cmd->add_option("--layers", a.layers, "number of layers (overrides --model)");
  cmd->add_option("--hidden", a.hidden, "hidden width");
  cmd->add_option("--heads", a.heads, "attention heads");
  cmd->add_option("--vocab", a.vocab, "vocabulary size");
  cmd->add_option("--seq", a.seq, "sequence length");
  cmd->add_option("--precision", a.precision, "fp32 or bf16 (fp32 master unless --no-master)")
      ->capture_default_str();
  cmd->add_option("--accounting", a.accounting,
                  "paper: bf16 grads, 16 B/param (the default); keel: fp32 grads, 18 B/param, "
                  "keel's arena (the default with --lora-rank)");
  cmd->add_option("--lora-rank", a.lora_rank,
                  "LoRA fine-tuning: adapters of this rank, the base frozen ([lora] rank)");
  cmd->add_option("--lora-targets", a.lora_targets,
                  "products the adapters adapt, as [lora] targets (default: qkv / c_attn)");
  cmd->add_option("--lora-base", a.lora_base,
                  "the frozen base's block matrices: none (the precision's), int8 or nf4, as "
                  "[lora] base");
  cmd->add_flag("--lora-dora", a.lora_dora, "DoRA's magnitudes over the adapters, as [lora] dora");
  cmd->add_option("--state-dtype", a.state_dtype,
                  "AdamW's moments: fp32 or bf16 (stochastically rounded), as optim.state_dtype")
      ->capture_default_str();
  cmd->add_option("--grad-dtype", a.grad_dtype,
                  "the gradient buffer: fp32 or bf16 (fp32 buckets added into it), as "
                  "optim.grad_dtype")
      ->capture_default_str();
  cmd->add_option("--grad-comm", a.grad_comm,
                  "the data-parallel gradient sums' wire format: fp32, bf16 or int8 (with error "
                  "feedback), as [parallel] grad_comm")
      ->capture_default_str();
  cmd->add_option("--diloco-inner-steps", a.diloco_inner_steps,
                  "DiLoCo's inner steps between the replicas' outer steps, as [parallel] dp_sync "
                  "= \"diloco\" with [diloco] inner_steps (0: synchronous)");
  cmd->add_option("--diloco-fragments", a.diloco_fragments,
                  "streaming DiLoCo's fragments, as [diloco] fragments")
      ->capture_default_str();
  cmd->add_option("--diloco-overlap-steps", a.diloco_overlap_steps,
                  "streaming DiLoCo's overlap, as [diloco] overlap_steps")
      ->capture_default_str();
  cmd->add_flag("--no-master", a.no_master,
                "bf16 weights without an fp32 master (stochastic rounding), as "
                "optim.master_weights = false");
  cmd->add_flag("--offload", a.offload,
                "AdamW's moments (and a bf16 run's master) on a disk tier, as [offload] dir");
  cmd->add_flag("--offload-host", a.offload_host,
                "a GPU's master and moments in pinned host memory, updated by the CPU, as "
                "[offload] host = true");
  cmd->add_flag("--offload-params", a.offload_params,
                "with --offload, at ZeRO 3: the weights' shard on the tier too, as [offload] "
                "params = true");
  cmd->add_option("--offload-chunk-mib", a.offload_chunk_mib,
                  "the tier's chunk buffers, as [offload] chunk_mib")
      ->capture_default_str();
  cmd->add_option("--offload-gbps", a.offload_gbps,
                  "the tier's bandwidth, GB/s: a disk's per node, read and write (default 2; keel "
                  "preflight measures it), or each GPU's link to the host for --offload-host "
                  "(default: the accelerator's, as --host-gbps)");
  cmd->add_option("--global-batch", a.global_batch, "sequences per step")->capture_default_str();
  cmd->add_option("--accelerator", a.accel, "A100-80GB, H100-80GB, H200-141GB, this-cpu (measured)")
      ->capture_default_str();
  cmd->add_option("--accelerators", a.world, "accelerators in all")->capture_default_str();
  cmd->add_option("--per-node", a.per_node, "accelerators per node")->capture_default_str();
  cmd->add_option("--tflops", a.tflops, "override: peak bf16 TFLOP/s");
  cmd->add_option("--fp32-tflops", a.fp32_tflops, "override: peak fp32 TFLOP/s");
  cmd->add_option("--memory-gb", a.memory_gb, "override: memory per accelerator, GB");
  cmd->add_option("--hbm-gbps", a.hbm_gbps, "override: HBM bandwidth, GB/s");
  cmd->add_option("--intra-gbps", a.intra_gbps, "override: intra-node bandwidth, GB/s");
  cmd->add_option("--inter-gbps", a.inter_gbps, "override: inter-node bandwidth, GB/s");
  cmd->add_option("--efficiency", a.efficiency,
                  "fraction of peak the matmuls reach (default 0.6; this-cpu: measured, keel's "
                  "kernels on the model's shapes)");
  cmd->add_option("--tp", a.tp, "fix tensor parallelism");
  cmd->add_option("--pp", a.pp, "fix pipeline parallelism");
  cmd->add_option("--virtual-stages", a.virtual_stages,
                  "interleaved 1F1B: model chunks per pipeline rank (default 1)");
  cmd->add_option("--dp", a.dp, "fix data parallelism");
  cmd->add_option("--cp", a.cp,
                  "fix context parallelism (default: searched from 8192-token sequences on)");
  cmd->add_option("--cp-comm", a.cp_comm,
                  "context parallelism's keys and values: ring or allgather")
      ->capture_default_str();
  cmd->add_option("--zero", a.zero, "fix the ZeRO stage (0-3)");
  cmd->add_option("--micro-batch", a.micro_batch, "fix sequences per micro-batch");
  cmd->add_option("--recompute", a.recompute, "none, selective, full or any")
      ->capture_default_str();
  cmd->add_option("--sp", a.sp, "sequence parallelism: on, off or any")->capture_default_str();
  cmd->add_option("--node-mtbf-hours", a.node_mtbf_hours, "mean hours between failures per node")
      ->capture_default_str();
  cmd->add_option("--storage-gbps", a.storage_gbps,
                  "checkpoint storage write bandwidth, GB/s in all (default 2 per node)");
  cmd->add_option("--host-gbps", a.host_gbps,
                  "override: copy to host memory (checkpoint snapshot)");
  cmd->add_option("--restart-minutes", a.restart_minutes,
                  "minutes from a failure to training again, before reading the checkpoint")
      ->capture_default_str();
  cmd->add_option("--price-per-hour", a.price_per_hour,
                  "price per accelerator-hour (for the cost)");
  cmd->add_option("--tokens", a.tokens, "training tokens (default 20 per parameter)");
  cmd->add_option("--top", a.top, "rows to show")->capture_default_str();
  cmd->add_flag("--json", a.json, "print JSON instead of a table");
  cmd->add_flag("--explain", a.explain, "explain the best layout (fix it with the flags above)");
  cmd->callback([cmd] {
    if (!a.config.empty()) ApplyToml(cmd, a.config);
    // this-cpu is one machine: unless told otherwise, plan for it alone.
    if (a.accel == "this-cpu") {
      if (cmd->get_option("--accelerators")->count() == 0) a.world = 1;
      if (cmd->get_option("--per-node")->count() == 0) a.per_node = 1;
    }
    const plan::Job job = MakeJob(a);
    const auto all = plan::Search(job, MakeConstraints(a));
    if (a.json) {
      nlohmann::json out = {{"model",
                             {{"name", job.model.name},
                              {"layers", job.model.layers},
                              {"hidden", job.model.hidden},
                              {"heads", job.model.heads},
                              {"vocab", job.model.vocab},
                              {"seq", job.model.seq},
                              {"params", plan::TotalParams(job.model)}}},
                            {"precision", plan::PrecisionName(job.precision)},
                            {"state_dtype", job.bf16_moments ? "bf16" : "fp32"},
                            {"master_weights", job.master},
                            {"grad_dtype", job.bf16_grads ? "bf16" : "fp32"},
                            {"grad_comm", parallel::GradWireName(job.grad_comm)},
                            {"diloco_inner_steps", job.diloco_inner_steps},
                            {"diloco_streaming", job.diloco_streaming},
                            {"offload",
                             {{"chunk_bytes", job.offload_chunk},
                              {"bytes_per_s", job.offload_bytes_per_s},
                              {"host", job.offload_host},
                              {"params", job.offload_params}}},
                            {"accounting", plan::AccountingName(job.accounting)},
                            {"global_batch", job.global_batch},
                            {"accelerator", job.cluster.accel.name},
                            {"accelerator_figures",
                             {{"bf16_flops", job.cluster.accel.bf16_flops},
                              {"fp32_flops", plan::PeakFlops(job.cluster.accel, true)},
                              {"memory_bytes", job.cluster.accel.memory_bytes},
                              {"memory_bytes_per_s", job.cluster.accel.hbm_bytes_per_s},
                              {"intra_bytes_per_s", job.cluster.accel.intra_bytes_per_s},
                              {"inter_bytes_per_s", job.cluster.accel.inter_bytes_per_s},
                              {"host_bytes_per_s", job.cluster.accel.host_bytes_per_s},
                              {"measured_flops", job.cluster.accel.measured_flops},
                              {"measured", job.cluster.accel.measured_note}}},
                            {"efficiency", job.efficiency},
                            {"accelerators", job.cluster.world},
                            {"layouts", nlohmann::json::array()}};
      // The best `top` that fit, then the `top` closest to fitting, each with its reason.
      int fit = 0, rejected = 0;
      for (const auto& e : all)
        if (e.fits ? fit++ < a.top : rejected++ < a.top)
          out["layouts"].push_back(plan_output::EstimateJson(e));
      out["fit"] = fit;
      out["checkpoint"] = plan_output::CheckpointJson(all.front().ckpt);
      out["node_mtbf_hours"] = job.run.node_mtbf_hours;
      out["price_per_hour"] = job.run.price_per_hour;
      out["evaluated"] = all.size();
      std::printf("%s\n", out.dump(2).c_str());
      return;
    }
    plan_output::PrintHeader(job);
    if (a.explain)
      plan_output::PrintExplain(job, all.front());
    else
      plan_output::PrintTable(job, all, a.top);
  });
}

}  // namespace keel::cli

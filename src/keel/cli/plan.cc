// keel plan: rank every parallel layout of a model on a cluster by estimated tokens/s, with the
// memory per accelerator broken down and the layouts that do not fit rejected with the reason.
// The models live in keel/plan; this file only reads the request and prints the answer.
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/monitor/machine_probe.h"
#include "keel/plan/search.h"

namespace keel::cli {

namespace {

struct PlanArgs {
  std::string config, model, precision = "bf16", accounting = "paper", accel = "H100-80GB";
  std::string recompute = "any", sp = "any";
  int layers = 0, hidden = 0, heads = 0, vocab = 0, seq = 0;
  int global_batch = 512, world = 8, per_node = 8, top = 10;
  int tp = -1, pp = -1, dp = -1, zero = -1, micro_batch = -1;
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

}  // namespace

plan::Accelerator MeasureThisCpu() {
  // Short runs (0.05 s per loop, best of 2; a 256 MiB copy, best of 3): well under 2 s in all,
  // and the per-thread CPU time keeps the FLOP/s honest on a busy machine.
  const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  const monitor::PeakRates r = monitor::MeasurePeakRates(threads, 0.05, 2);
  plan::CpuFigures f;
  f.bf16_flops = r.bf16();
  f.fp32_flops = r.fp32_fma;
  f.memory_bytes = monitor::MemTotalBytes();
  f.copy_bytes_per_s = monitor::MeasureCopyRate(threads, size_t(256) << 20, 3);
  if (f.bf16_flops <= 0 || f.memory_bytes <= 0 || f.copy_bytes_per_s <= 0)
    ThrowRuntime(
        "plan: this-cpu: could not measure this machine (needs AVX-512 and /proc/meminfo)");
  return plan::ThisCpu(f);
}

namespace {

plan::Job MakeJob(const PlanArgs& a) {
  plan::Job job;
  if (!a.model.empty()) {
    job.model = plan::NamedModel(a.model);
  } else if (a.layers == 0 && a.hidden == 0) {
    ThrowBadInput("plan: give --model NAME or --layers/--hidden/--heads (see keel help plan)");
  }
  if (a.layers) job.model.layers = a.layers;
  if (a.hidden) job.model.hidden = a.hidden;
  if (a.heads) job.model.heads = a.heads;
  if (a.vocab) job.model.vocab = a.vocab;
  if (a.seq) job.model.seq = a.seq;
  if (a.model.empty() || a.layers || a.hidden || a.heads || a.vocab || a.seq)
    job.model.name = a.model.empty() ? "custom" : a.model + " (modified)";
  plan::ValidateModel(job.model);
  job.precision = plan::ParsePrecision(a.precision);
  job.accounting = plan::ParseAccounting(a.accounting);
  job.global_batch = a.global_batch;
  if (a.efficiency != -1 && !(a.efficiency > 0 && a.efficiency <= 1)) {
    char num[32];
    std::snprintf(num, sizeof(num), "%g", a.efficiency);
    ThrowBadInput(std::string("plan: --efficiency ") + num + " not in (0, 1]");
  }
  job.cluster.accel = a.accel == "this-cpu" ? MeasureThisCpu() : plan::NamedAccelerator(a.accel);
  job.cluster.world = a.world;
  job.cluster.per_node = a.per_node;
  plan::Accelerator& acc = job.cluster.accel;
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
  plan::Constraints c{a.tp, a.pp, a.dp, a.zero, a.micro_batch, -1, {}};
  // -1 is "not given"; anything else below 1 (below 0 for ZeRO) is a mistake, not "any".
  const std::pair<const char*, int> fixed[] = {
      {"--tp", a.tp}, {"--pp", a.pp}, {"--dp", a.dp}, {"--micro-batch", a.micro_batch}};
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
  return c;
}

nlohmann::json CostJson(const plan::RunCost& c);

nlohmann::json ToJson(const plan::Estimate& e) {
  const auto& l = e.layout;
  const auto& m = e.memory;
  return {
      {"tp", l.tp},
      {"pp", l.pp},
      {"dp", l.dp},
      {"zero", l.zero},
      {"micro_batch", l.micro_batch},
      {"recompute", plan::RecomputeName(l.recompute)},
      {"sp", l.sp},
      {"fits", e.fits},
      {"reason", e.reason},
      {"memory_bytes",
       {{"params", m.state.params},
        {"grads", m.state.grads},
        {"master", m.state.master},
        {"moments", m.state.moments},
        {"activations", m.activations},
        {"comm_buffers", m.comm_buffers},
        {"headroom", m.headroom},
        {"used", m.used()},
        {"capacity", m.capacity}}},
      {"activation_row", e.activation_row},
      {"comm_bytes", {{"tp", e.comm.tp_bytes}, {"pp", e.comm.pp_bytes}, {"dp", e.comm.dp_bytes}}},
      {"comm_s", {{"tp", e.comm.tp_s}, {"pp", e.comm.pp_s}, {"dp", e.comm.dp_s}}},
      {"micro_batches", e.time.micro_batches},
      {"bubble", e.time.bubble},
      {"compute_s", e.time.compute_s},
      {"exposed_comm_s", e.time.exposed_comm_s},
      {"step_s", e.time.step_s},
      {"tokens_per_s", e.time.tokens_per_s},
      {"mfu", e.time.mfu},
      {"cost", CostJson(e.cost)}};
}

// Infinity (goodput 0) has no JSON spelling; null says "never finishes".
nlohmann::json Finite(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); }

nlohmann::json CostJson(const plan::RunCost& c) {
  return {{"tokens", c.tokens},
          {"default_tokens", c.default_tokens},
          {"total_flops", c.total_flops},
          {"accel_hours", c.accel_hours},
          {"wall_days", c.wall_days},
          {"money", c.money},
          {"failure_accel_hours", Finite(c.failure_accel_hours)},
          {"failure_days", Finite(c.failure_days)},
          {"failure_money", Finite(c.failure_money)}};
}

nlohmann::json CheckpointJson(const plan::CheckpointPlan& c) {
  return {{"state_bytes", c.state_bytes},
          {"nodes", c.nodes},
          {"storage_bytes_per_s", c.storage_bytes_per_s},
          {"blocking_s", c.blocking_s},
          {"write_s", c.write_s},
          {"restart_s", c.restart_s},
          {"job_mtbf_s", c.job_mtbf_s},
          {"young_s", c.young_s},
          {"daly_s", c.daly_s},
          {"interval_s", c.interval_s},
          {"save_fraction", c.save_fraction},
          {"lost_fraction", c.lost_fraction},
          {"goodput", c.goodput}};
}

void PrintHeader(const plan::Job& j) {
  const auto bpp = plan::StateBytesPerParam(j.precision, j.accounting);
  std::printf("model %s: %d layers, hidden %d, %d heads, vocab %d, seq %d, %.3gB params\n",
              j.model.name.c_str(), j.model.layers, j.model.hidden, j.model.heads, j.model.vocab,
              j.model.seq, plan::TotalParams(j.model) / 1e9);
  std::printf("%s, AdamW, %s accounting (%g bytes/param), global batch %d sequences\n",
              plan::PrecisionName(j.precision), plan::AccountingName(j.accounting), bpp.total(),
              j.global_batch);
  const auto& a = j.cluster.accel;
  std::printf(
      "cluster: %d x %s (%d per node): %.4g TFLOP/s bf16, %.4g fp32, %.4g GB, memory %.4g GB/s, "
      "intra-node %.4g GB/s, network %.4g GB/s; matmul efficiency %.3g\n\n",
      j.cluster.world, a.name.c_str(), j.cluster.per_node, a.bf16_flops / 1e12,
      plan::PeakFlops(a, true) / 1e12, a.memory_bytes / 1e9, a.hbm_bytes_per_s / 1e9,
      a.intra_bytes_per_s / 1e9, a.inter_bytes_per_s / 1e9, j.efficiency);
}

// "42 s", "12.5 min", "3.2 h", "85.1 days": durations at the scale a reader thinks in.
std::string Duration(double s) {
  char buf[32];
  if (!std::isfinite(s)) return "never";
  if (s < 120)
    std::snprintf(buf, sizeof(buf), "%.3g s", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof(buf), "%.1f min", s / 60);
  else if (s < 3 * 86400)
    std::snprintf(buf, sizeof(buf), "%.1f h", s / 3600);
  else
    std::snprintf(buf, sizeof(buf), "%.1f days", s / 86400);
  return buf;
}

std::string Money(double x) {
  char buf[32];
  if (!std::isfinite(x)) return "never";
  if (x >= 1e6)
    std::snprintf(buf, sizeof(buf), "$%.2fM", x / 1e6);
  else if (x >= 1e3)
    std::snprintf(buf, sizeof(buf), "$%.1fk", x / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "$%.2f", x);
  return buf;
}

// The checkpoint and cost summary under the table; --explain shows the arithmetic.
void PrintRun(const plan::Job& j, const plan::Estimate& e, bool explain) {
  const auto& c = e.ckpt;
  const auto& k = e.cost;
  const double lag = c.write_s - c.blocking_s;
  if (!explain) {
    std::printf(
        "checkpoints: %.4g GB of state, %s blocking, %s to storage; job MTBF %s (%d nodes x "
        "%g h)\n  save every %s (Daly; Young %s): %.2f%% of the time saving, %.2f%% redoing lost "
        "work and restarting; goodput %.1f%%\n",
        c.state_bytes / 1e9, Duration(c.blocking_s).c_str(), Duration(c.write_s).c_str(),
        Duration(c.job_mtbf_s).c_str(), c.nodes, j.run.node_mtbf_hours,
        Duration(c.interval_s).c_str(), Duration(c.young_s).c_str(), 100 * c.save_fraction,
        100 * c.lost_fraction, 100 * c.goodput);
    std::printf(
        "cost (rank 1): %.3g tokens%s, %.3g FLOPs, %.4g accelerator-hours at %.1f%% MFU, %.1f "
        "days on %d accelerators",
        k.tokens, k.default_tokens ? " (20 per parameter)" : "", k.total_flops, k.accel_hours,
        100 * e.time.mfu, k.wall_days, j.cluster.world);
    if (k.money > 0) std::printf(", %s at $%g/h", Money(k.money).c_str(), j.run.price_per_hour);
    std::printf("; failures add %s", Duration(k.failure_days * 86400).c_str());
    if (k.money > 0) std::printf(" and %s", Money(k.failure_money).c_str());
    std::printf("\n");
    return;
  }
  const auto& a = j.cluster.accel;
  std::printf(
      "\ncheckpoints (asynchronous: training waits for the snapshot only, ckpt/writer.h):\n");
  std::printf("  state      12 B/param x %.4g params = %.4g GB (fp32 master + 2 moments)\n",
              c.state_bytes / 12, c.state_bytes / 1e9);
  std::printf("  blocking   d = %.4g GB / %d ranks / %g GB/s host copy = %s\n", c.state_bytes / 1e9,
              j.cluster.world, a.host_bytes_per_s / 1e9, Duration(c.blocking_s).c_str());
  std::printf("  write      d + %.4g GB / %g GB/s storage = %s (lag until committed: %s)\n",
              c.state_bytes / 1e9, c.storage_bytes_per_s / 1e9, Duration(c.write_s).c_str(),
              Duration(lag).c_str());
  std::printf("  restart    %s + reading the state back = %s\n", Duration(j.run.restart_s).c_str(),
              Duration(c.restart_s).c_str());
  std::printf("  job MTBF   M = %g h per node / %d nodes = %s\n", j.run.node_mtbf_hours, c.nodes,
              Duration(c.job_mtbf_s).c_str());
  std::printf("  Young      sqrt(2dM) = %.4g s\n", c.young_s);
  std::printf("  Daly       sqrt(2dM)(1 + sqrt(d/2M)/3 + (d/2M)/9) - d = %.4g s\n", c.daly_s);
  std::printf("  interval   t = max(Daly, lag) = %s\n", Duration(c.interval_s).c_str());
  std::printf("  saving     d/(t+d) = %.4f%%\n", 100 * c.save_fraction);
  std::printf("  lost       ((t+d)/2 + lag + restart)/M = %.4f%%\n", 100 * c.lost_fraction);
  std::printf("  goodput    1 - saving - lost = %.2f%%\n", 100 * c.goodput);
  std::printf("\ncost:\n");
  std::printf("  tokens     %.4g%s\n", k.tokens, k.default_tokens ? " (20 per parameter)" : "");
  std::printf("  FLOPs      tokens x (6N + 12Lhs) = %.4g\n", k.total_flops);
  std::printf("  accel-h    FLOPs / (%.4g TFLOP/s peak x %.2f%% MFU) / 3600 = %.5g\n",
              plan::PeakFlops(a, j.precision == plan::Precision::kFp32) / 1e12, 100 * e.time.mfu,
              k.accel_hours);
  std::printf("  wall       accel-h / %d / 24 = %.4g days\n", j.cluster.world, k.wall_days);
  if (k.money > 0)
    std::printf("  money      accel-h x $%g = %s\n", j.run.price_per_hour, Money(k.money).c_str());
  std::printf("  failures   x (1/goodput - 1): +%s, +%.5g accel-h",
              Duration(k.failure_days * 86400).c_str(), k.failure_accel_hours);
  if (k.money > 0) std::printf(", +%s", Money(k.failure_money).c_str());
  std::printf("\n");
}

void PrintExplain(const plan::Job& j, const plan::Estimate& e) {
  const auto& m = e.memory;
  std::printf("layout: %s\n%s\n\n", plan::LayoutName(e.layout).c_str(),
              e.fits ? "fits" : ("does not fit: " + e.reason).c_str());
  std::printf("memory per accelerator (GB):\n");
  std::printf(
      "  params        %9.3f\n  grads         %9.3f\n  master        %9.3f\n"
      "  moments       %9.3f\n  activations   %9.3f   (%s)\n  comm buffers  %9.3f\n"
      "  total         %9.3f\n  headroom      %9.3f\n  capacity      %9.3f\n\n",
      m.state.params / 1e9, m.state.grads / 1e9, m.state.master / 1e9, m.state.moments / 1e9,
      m.activations / 1e9, e.activation_row.c_str(), m.comm_buffers / 1e9, m.used() / 1e9,
      m.headroom / 1e9, m.capacity / 1e9);
  auto link = [](bool intra) { return intra ? "NVLink" : "network"; };
  std::printf("communication per step per rank:\n");
  std::printf("  tp  %10.3f GB  %8.4f s (%s)\n", e.comm.tp_bytes / 1e9, e.comm.tp_s,
              link(e.comm.tp_intra));
  std::printf("  pp  %10.3f GB  %8.4f s (%s)\n", e.comm.pp_bytes / 1e9, e.comm.pp_s,
              link(e.comm.pp_intra));
  std::printf("  dp  %10.3f GB  %8.4f s (%s, overlaps backward)\n\n", e.comm.dp_bytes / 1e9,
              e.comm.dp_s, link(e.comm.dp_intra));
  const auto& t = e.time;
  std::printf(
      "time: %d micro-batches, bubble %.3f = (pp-1)/(m+pp-1), compute %.3f s, exposed "
      "comm %.3f s\nstep %.3f s, %.0f tokens/s, MFU %.1f%% (6N + 12Lhs per token)\n",
      t.micro_batches, t.bubble, t.compute_s, t.exposed_comm_s, t.step_s, t.tokens_per_s,
      100 * t.mfu);
  PrintRun(j, e, /*explain=*/true);
}

void PrintTable(const plan::Job& j, const std::vector<plan::Estimate>& all, int top) {
  // days and cost: the whole run (token budget) with the expected failure overhead.
  std::printf("%4s %4s %4s %5s %4s %4s %5s %-9s %3s %8s %8s %11s %6s %6s %7s %8s\n", "rank", "tp",
              "pp", "dp", "zero", "mb", "m", "recompute", "sp", "mem GB", "step s", "tokens/s",
              "MFU", "bubble", "days", "cost");
  int shown = 0, fit = 0;
  for (const auto& e : all) fit += e.fits;
  for (const auto& e : all) {
    if (!e.fits || shown >= top) break;
    const auto& l = e.layout;
    const auto& k = e.cost;
    std::printf("%4d %4d %4d %5d %4d %4d %5d %-9s %3s %8.2f %8.3f %11.0f %5.1f%% %6.3f %7.4g %8s\n",
                ++shown, l.tp, l.pp, l.dp, l.zero, l.micro_batch, e.time.micro_batches,
                plan::RecomputeName(l.recompute), l.sp ? "on" : "off", e.memory.used() / 1e9,
                e.time.step_s, e.time.tokens_per_s, 100 * e.time.mfu, e.time.bubble,
                k.wall_days + k.failure_days,
                k.money > 0 ? Money(k.money + k.failure_money).c_str() : "-");
  }
  std::printf("\n%d of %zu layouts fit", fit, all.size());
  if (fit < int(all.size())) {
    const auto& r = all[fit];  // the rejected layout closest to fitting
    std::printf("; closest rejected: %s: %s", plan::LayoutName(r.layout).c_str(), r.reason.c_str());
  }
  std::printf("\n");
  if (fit > 0) PrintRun(j, all.front(), /*explain=*/false);
  if (fit == 0) ThrowBadInput("plan: no layout fits in memory (see the closest rejected above)");
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
  cmd->add_option("--precision", a.precision, "fp32 or bf16 (fp32 master)")->capture_default_str();
  cmd->add_option("--accounting", a.accounting,
                  "paper: bf16 grads, 16 B/param; keel: fp32 grads, 18 B/param, keel's arena")
      ->capture_default_str();
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
                  "fraction of peak the matmuls reach (default 0.6; this-cpu: keel's measured "
                  "MFU, 0.5 fp32, 0.095 bf16)");
  cmd->add_option("--tp", a.tp, "fix tensor parallelism");
  cmd->add_option("--pp", a.pp, "fix pipeline parallelism");
  cmd->add_option("--dp", a.dp, "fix data parallelism");
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
                              {"host_bytes_per_s", job.cluster.accel.host_bytes_per_s}}},
                            {"accelerators", job.cluster.world},
                            {"layouts", nlohmann::json::array()}};
      // The best `top` that fit, then the `top` closest to fitting, each with its reason.
      int fit = 0, rejected = 0;
      for (const auto& e : all)
        if (e.fits ? fit++ < a.top : rejected++ < a.top) out["layouts"].push_back(ToJson(e));
      out["fit"] = fit;
      out["checkpoint"] = CheckpointJson(all.front().ckpt);
      out["node_mtbf_hours"] = job.run.node_mtbf_hours;
      out["price_per_hour"] = job.run.price_per_hour;
      out["evaluated"] = all.size();
      std::printf("%s\n", out.dump(2).c_str());
      return;
    }
    PrintHeader(job);
    if (a.explain)
      PrintExplain(job, all.front());
    else
      PrintTable(job, all, a.top);
  });
}

}  // namespace keel::cli

// What `keel plan` prints: the header, the ranked table with the run's checkpoint and cost
// summary, --explain's step-by-step arithmetic, and the JSON of one estimate.
#include "keel/cli/plan_output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "keel/core/error.h"
#include "keel/model/config.h"
#include "keel/plan/memory.h"

namespace keel::cli::plan_output {

namespace {

nlohmann::json CostJson(const plan::RunCost& c);

}  // namespace

nlohmann::json EstimateJson(const plan::Estimate& e) {
  const auto& l = e.layout;
  const auto& m = e.memory;
  return {{"tp", l.tp},
          {"pp", l.pp},
          {"dp", l.dp},
          {"zero", l.zero},
          {"micro_batch", l.micro_batch},
          {"recompute", plan::RecomputeName(l.recompute)},
          {"sp", l.sp},
          {"virtual_stages", l.virtual_stages},
          {"cp", l.cp},
          {"cp_comm", parallel::CpCommName(l.cp_comm)},
          {"fits", e.fits},
          {"reason", e.reason},
          {"memory_bytes",
           {{"params", m.state.params},
            {"grads", m.state.grads},
            {"master", m.state.master},
            {"moments", m.state.moments},
            {"offload_buffers", m.state.offload},
            {"offload_tier", m.tier},
            {"activations", m.activations},
            {"comm_buffers", m.comm_buffers},
            {"headroom", m.headroom},
            {"used", m.used()},
            {"capacity", m.capacity}}},
          {"activation_row", e.activation_row},
          {"comm_bytes",
           {{"tp", e.comm.tp_bytes},
            {"pp", e.comm.pp_bytes},
            {"dp", e.comm.dp_bytes},
            {"cp", e.comm.cp_bytes}}},
          {"comm_s",
           {{"tp", e.comm.tp_s}, {"pp", e.comm.pp_s}, {"dp", e.comm.dp_s}, {"cp", e.comm.cp_s}}},
          {"micro_batches", e.time.micro_batches},
          {"bubble", e.time.bubble},
          {"compute_s", e.time.compute_s},
          {"exposed_comm_s", e.time.exposed_comm_s},
          {"offload_s", e.time.offload_s},
          {"step_s", e.time.step_s},
          {"tokens_per_s", e.time.tokens_per_s},
          {"mfu", e.time.mfu},
          {"cost", CostJson(e.cost)}};
}

namespace {

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

}  // namespace

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
          {"goodput", c.goodput},
          {"peer", c.peer ? nlohmann::json{{"send_s", c.peer_send_s},
                                           {"restart_s", c.peer_restart_s},
                                           {"interval_s", c.peer_interval_s},
                                           {"uncovered_mtbf_s", c.peer_uncovered_mtbf_s},
                                           {"shared_interval_s", c.peer_shared_interval_s},
                                           {"save_fraction", c.peer_save_fraction},
                                           {"lost_fraction", c.peer_lost_fraction},
                                           {"goodput", c.peer_goodput}}
                          : nlohmann::json()}};
}

void PrintHeader(const plan::Job& j) {
  const auto bpp = plan::StateBytesPerParam(j);
  std::string shape;
  if (j.model.family == model::Family::kLlama)
    shape = " (Llama: " + std::to_string(j.model.kv_heads) + " key/value heads, SwiGLU " +
            std::to_string(j.model.ffn) + ")";
  std::printf("model %s: %d layers, hidden %d, %d heads%s, vocab %d, seq %d, %.3gB params\n",
              j.model.name.c_str(), j.model.layers, j.model.hidden, j.model.heads, shape.c_str(),
              j.model.vocab, j.model.seq, plan::TotalParams(j.model) / 1e9);
  if (j.model.lora_rank > 0) {
    const double n = plan::TotalParams(j.model), t = plan::TrainableParams(j.model);
    std::printf(
        "LoRA rank %d%s on %s: %.4g M trainable parameters (%.3g%%), the base frozen%s: master and "
        "moments for the adapters only, %.4g MB of fp32 gradients reduced per step (full "
        "fine-tuning: %.4g GB), no weight-gradient products for the base's %.3gB\n",
        j.model.lora_rank, j.model.lora_dora ? " (DoRA)" : "",
        model::LoraTargetsText(plan::ToModelConfig(j.model)).c_str(), t / 1e6, 100 * t / n,
        j.model.lora_base == model::BaseQuant::kNone
            ? ""
            : (std::string(" (block matrices as ") + model::BaseQuantName(j.model.lora_base) + ")")
                  .c_str(),
        4 * t / 1e6, 4 * (n - t) / 1e9, plan::FrozenMatmulParams(j.model) / 1e9);
  }
  char per_param[48];
  std::snprintf(per_param, sizeof(per_param), "%g bytes/param", bpp.total());
  std::printf("%s, AdamW, %s accounting (%s), global batch %d sequences\n",
              plan::PrecisionName(j.precision), plan::AccountingName(j.accounting),
              j.model.lora_rank > 0 ? "LoRA: weights, fp32 gradients, adapters' state" : per_param,
              j.global_batch);
  const auto& a = j.cluster.accel;
  std::printf(
      "cluster: %d x %s (%d per node): %.4g TFLOP/s bf16, %.4g fp32, %.4g GB, memory %.4g GB/s, "
      "intra-node %.4g GB/s, network %.4g GB/s; matmul efficiency %.3g\n\n",
      j.cluster.world, a.name.c_str(), j.cluster.per_node, a.bf16_flops / 1e12,
      plan::PeakFlops(a, true) / 1e12, a.memory_bytes / 1e9, a.hbm_bytes_per_s / 1e9,
      a.intra_bytes_per_s / 1e9, a.inter_bytes_per_s / 1e9, j.efficiency);
  // this-cpu: which figures were measured, and how (the note from cli/plan.cc).
  if (a.name == "this-cpu") {
    if (a.measured_flops > 0)
      std::printf(
          "this-cpu: matmul efficiency %.3g = %.4g GFLOP/s measured / %.4g GFLOP/s peak (%s)\n"
          "  measured: %s\n\n",
          j.efficiency, a.measured_flops / 1e9, plan::PeakFlops(a, a.measured_fp32) / 1e9,
          plan::PrecisionName(j.precision), a.measured_note.c_str());
    else
      std::printf("this-cpu: matmul efficiency %.3g as given (no kernels timed). %s\n\n",
                  j.efficiency, a.measured_note.c_str());
  }
}

namespace {

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
    if (c.peer)
      std::printf(
          "  with tier-0 copies in a buddy node's memory ([checkpoint] peer_every under keel "
          "launch): a copy every %s (%s to the buddy), the shared save every %s; goodput %.1f%%\n",
          Duration(c.peer_interval_s).c_str(), Duration(c.peer_send_s).c_str(),
          Duration(c.peer_shared_interval_s).c_str(), 100 * c.peer_goodput);
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

// The groups and collectives of this layout as `keel train` builds them (parallel/groups.h,
// train/zero.h, train/pipeline.h), so a plan names what the trainer will run.
void PrintGroups(const plan::Layout& l) {
  std::printf("process groups (as keel train splits them; ranks numbered tp, then dp, then pp):\n");
  static const char* const kZero[] = {
      "all-reduce of the gradients in [parallel] bucket_mb buckets, overlapping the last "
      "micro-batch's backward",
      "all-reduce of the gradients, then all-gather of the updated weights (ZeRO 1)",
      "reduce-scatter of each segment's gradients every micro-batch, all-gather of the updated "
      "weights (ZeRO 2)",
      "ZeRO 2's, plus an all-gather of each block's weights before its forward and its backward "
      "(ZeRO 3)"};
  if (l.replicas() > 1)
    std::printf("  dp    %d ranks each (same tp, pp%s): %s\n", l.replicas(),
                l.cp > 1 ? "; dp x cp, the gradient group" : "", kZero[std::clamp(l.zero, 0, 3)]);
  if (l.pp > 1) {
    std::printf(
        "  pp    %d stages each (same dp, tp): %s; send/recv of one (micro-batch x seq%s x "
        "hidden) activation down and its gradient up per micro-batch and stage boundary\n",
        l.pp, l.sp && l.tp > 1 ? " / tp" : "",
        l.virtual_stages > 1
            ? ("interleaved 1F1B, " + std::to_string(l.virtual_stages) + " chunks per rank").c_str()
            : "1F1B");
    std::printf("  tied  first and last stage: all-reduce of wte's gradient once per step\n");
  }
  if (l.tp > 1) {
    std::printf(
        "  tp    %d ranks each (same dp, pp; neighbours): per block %s after the attention's and "
        "the MLP's row-parallel projection in forward, %s after their column-parallel products' "
        "input gradients in backward; the vocabulary-parallel embedding's %s and the "
        "classifier's input gradient the same way; the loss all-gathers each row's "
        "log-sum-exp and target logit (8 bytes a row)\n",
        l.tp, l.sp ? "one reduce-scatter" : "one all-reduce",
        l.sp ? "one reduce-scatter" : "one all-reduce", l.sp ? "reduce-scatter" : "all-reduce");
    if (l.sp)
      std::printf(
          "        sequence parallel: each rank keeps 1/%d of the (micro-batch x seq) rows; "
          "an all-gather of the LayerNorm output before each column-parallel product (again "
          "in backward), and of the final LayerNorm's before the classifier; the LayerNorms' "
          "gradients all-reduced once per step\n",
          l.tp);
  }
  if (l.cp > 1)
    std::printf(
        "  cp    %d ranks each (same dp, tp, pp): each holds 2 of the sequence's %d chunks "
        "(head and tail); per block %s\n",
        l.cp, 2 * l.cp,
        l.cp_comm == parallel::CpComm::kRing
            ? "the keys and values go around the ring, one rank's per step beside the attention "
              "of the ones before, again in backward with their fp32 gradients"
            : "an all-gather of the keys and values (again in backward) and a reduce-scatter of "
              "their gradients");
  if (l.dp * l.pp * l.tp * l.cp == 1) std::printf("  none: one rank\n");
  std::printf("\n");
}

}  // namespace

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
  if (m.tier > 0 && j.offload_host) {
    const auto& t = e.time;
    std::printf(
        "offload tier ([offload] host): %.3f GB per rank in pinned host memory, updated by the "
        "CPU\n  the update copies %.3f GB of gradients and weights per rank over PCIe at %.2f "
        "GB/s = %.3f s, %.0f%% of the step%s\n\n",
        m.tier / 1e9, m.tier_traffic / 1e9, j.offload_bytes_per_s / 1e9, t.offload_s,
        100 * t.offload_s / t.step_s,
        t.offload_s > t.compute_s ? ": copy-bound (the link's traffic exceeds the compute)" : "");
  } else if (m.tier > 0) {
    const auto& t = e.time;
    std::printf(
        "offload tier ([offload]): %.3f GB per rank on disk, %.3f GB of chunk buffers in memory\n"
        "  the update reads and writes it once a step%s: %.3f GB per node at %.2f GB/s = %.3f s, "
        "%.0f%% of the step%s\n\n",
        m.tier / 1e9, m.state.offload / 1e9,
        j.offload_params && e.layout.zero >= 3
            ? ", and every gather reads its part of the weights' shard (forward and backward)"
            : "",
        m.tier_traffic * std::min(j.cluster.per_node, j.cluster.world) / 1e9,
        j.offload_bytes_per_s / 1e9, t.offload_s, 100 * t.offload_s / t.step_s,
        t.offload_s > t.compute_s ? ": I/O-bound (the tier's traffic exceeds the compute)" : "");
  }
  auto link = [](bool intra) { return intra ? "NVLink" : "network"; };
  std::printf("communication per step per rank:\n");
  std::printf("  tp  %10.3f GB  %8.4f s (%s)\n", e.comm.tp_bytes / 1e9, e.comm.tp_s,
              link(e.comm.tp_intra));
  std::printf("  pp  %10.3f GB  %8.4f s (%s)\n", e.comm.pp_bytes / 1e9, e.comm.pp_s,
              link(e.comm.pp_intra));
  if (e.layout.cp > 1)
    std::printf(
        "  cp  %10.3f GB  %8.4f s (%s%s)\n", e.comm.cp_bytes / 1e9, e.comm.cp_s,
        link(e.comm.cp_intra),
        e.layout.cp_comm == parallel::CpComm::kRing ? ", overlaps the attention blocks" : "");
  std::printf("  dp  %10.3f GB  %8.4f s (%s, overlaps backward)\n\n", e.comm.dp_bytes / 1e9,
              e.comm.dp_s, link(e.comm.dp_intra));
  PrintGroups(e.layout);
  const auto& t = e.time;
  std::printf(
      "time: %d micro-batches, bubble %.3f = (pp-1)/(m+pp-1)/v, compute %.3f s, exposed "
      "comm %.3f s\nstep %.3f s, %.0f tokens/s, MFU %.1f%% (6N + 12Lhs per token)\n",
      t.micro_batches, t.bubble, t.compute_s, t.exposed_comm_s, t.step_s, t.tokens_per_s,
      100 * t.mfu);
  PrintRun(j, e, /*explain=*/true);
}

void PrintTable(const plan::Job& j, const std::vector<plan::Estimate>& all, int top) {
  // days and cost: the whole run (token budget) with the expected failure overhead.
  std::printf("%4s %4s %4s %3s %5s %4s %4s %5s %-9s %3s %8s %8s %11s %6s %6s %7s %8s\n", "rank",
              "tp", "pp", "cp", "dp", "zero", "mb", "m", "recompute", "sp", "mem GB", "step s",
              "tokens/s", "MFU", "bubble", "days", "cost");
  int shown = 0, fit = 0;
  for (const auto& e : all) fit += e.fits;
  for (const auto& e : all) {
    if (!e.fits || shown >= top) break;
    const auto& l = e.layout;
    const auto& k = e.cost;
    std::printf(
        "%4d %4d %4d %3d %5d %4d %4d %5d %-9s %3s %8.2f %8.3f %11.0f %5.1f%% %6.3f %7.4g %8s\n",
        ++shown, l.tp, l.pp, l.cp, l.dp, l.zero, l.micro_batch, e.time.micro_batches,
        plan::RecomputeName(l.recompute), l.sp ? "on" : "off", e.memory.used() / 1e9, e.time.step_s,
        e.time.tokens_per_s, 100 * e.time.mfu, e.time.bubble, k.wall_days + k.failure_days,
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

}  // namespace keel::cli::plan_output

// The startup log of step_report.h: what a run is about to do, said once before its first step.
#include <string>

#include "keel/core/log.h"
#include "keel/kernels/backend.h"
#include "keel/kernels/cpu_isa.h"
#include "keel/train/run_setup.h"
#include "keel/train/step_report.h"

namespace keel::train {
namespace {

// " of 9+3 layers", or " x 2 interleaved chunks of 3 layer(s)".
std::string StageShape(const Run& run) {
  const int pp = run.layout.pp, v = run.layout.virtual_stages;
  if (v > 1)
    return " x " + std::to_string(v) + " interleaved chunks of " +
           std::to_string(run.mcfg.n_layer / (pp * v)) + " layer(s)";
  std::string shape;
  for (int i = 0; i < pp; ++i)
    shape += (i ? "+" : " of ") + std::to_string(run.layout.stage_layers.empty()
                                                     ? run.mcfg.n_layer / pp
                                                     : run.layout.stage_layers[size_t(i)]);
  return shape + " layers";
}

}  // namespace

void StepReporter::LogStart(const Run& run, const RunFacts& facts) {
  const parallel::Layout& dims = run.layout;
  const model::ModelConfig& mcfg = run.mcfg;
  const int T = cfg_.data.seq_len;
  Log("keel: %s %s, %zu parameters, %d rank(s) × %d thread(s), batch %d × %d tokens, "
      "%d micro-batch(es) of %d",
      cfg_.model.name.c_str(), DTypeName(run.dtype), run.params.total(), comm_.size(),
      facts.threads, cfg_.train.batch_size, T, dims.n_micro, dims.micro_batch);
  Log("keel: layout %s over %d rank(s)", parallel::DimsName(dims).c_str(), comm_.size());
  const std::string& wire = cfg_.parallel.grad_comm;
  if (cfg_.parallel.dp_sync == "diloco")
    Log("keel: DiLoCo: the %d replica(s) train alone for %d steps, then average their change in "
        "%s and take an outer step (SGD, lr %g, Nesterov momentum %g)",
        dims.dp, cfg_.diloco.inner_steps, wire.c_str(), double(cfg_.diloco.outer_lr),
        double(cfg_.diloco.outer_momentum));
  if (cfg_.parallel.dp_sync == "diloco" &&
      (cfg_.diloco.fragments > 1 || cfg_.diloco.overlap_steps > 0))
    Log("keel: streaming DiLoCo: %d fragment(s), rounds staggered by %d step(s); each fragment's "
        "average travels point-to-point and lands %d inner step(s) after it was sent",
        cfg_.diloco.fragments, cfg_.diloco.inner_steps / cfg_.diloco.fragments,
        cfg_.diloco.overlap_steps);
  else if (wire != "fp32")
    Log("keel: data-parallel gradients travel in %s%s and are summed in fp32 by each piece's "
        "owner%s",
        wire.c_str(), wire == "int8" ? " (blocks of 256, error feedback)" : "",
        dims.dp > 1 ? "" : " (dp = 1: nothing travels)");
  const bool on_cpu = run.step->backend().device() == kernels::Device::kCpu;
  Log("keel: MFU against a peak of %.1f GFLOP/s for rank 0's %d thread(s) in %s (%s); %.1f "
      "GFLOP/s for all ranks%s%s",
      facts.rank_peak.flops / 1e9, facts.threads, DTypeName(run.dtype),
      facts.rank_peak.source.c_str(), run.peak / 1e9, on_cpu ? "; kernels: " : "",
      on_cpu ? kernels::IsaName(kernels::ChosenCpuIsa()) : "");
  const bool emulated = run.step->backend().ProductsEmulated(run.dtype);
  if (run.dtype == DType::kF16 && on_cpu)
    Log("keel: fp16: products %s; MFU is against the fp32 peak; the loss scale starts at %g",
        emulated ? "run in fp32 on widened copies (no fp16 matrix unit oneDNN uses here)"
                 : "in fp16 through oneDNN, accumulated in fp32",
        cfg_.loss_scale.initial);
  if (run.dtype == DType::kBF16 && emulated)
    Log("keel: bf16 products run in fp32 on widened copies: this CPU has no bf16 instruction "
        "faster than its fp32 FMA (MFU is against the FMA's peak; KEEL_BF16_PRODUCTS=native|fp32 "
        "chooses)");
  if (dims.tp > 1)
    Log("keel: tensor parallel: %d ranks, each with %d of %d heads, %d of %d MLP units and %d "
        "of %d vocabulary rows%s",
        dims.tp, mcfg.n_head / dims.tp, mcfg.n_head, 4 * mcfg.n_embd / dims.tp, 4 * mcfg.n_embd,
        mcfg.padded_vocab() / dims.tp, mcfg.padded_vocab(),
        cfg_.parallel.sp
            ? ("; sequence parallel: " + std::to_string(dims.micro_batch * T / dims.tp) + " of " +
               std::to_string(dims.micro_batch * T) + " rows per micro-batch")
                  .c_str()
            : "");
  if (run.pipelined)
    Log("keel: pipeline: %d stages%s, 1F1B over %d micro-batches; predicted bubble %.1f%% "
        "((pp - 1) / (m + pp - 1)%s)",
        dims.pp, StageShape(run).c_str(), dims.n_micro, 100 * run.bubble_predicted,
        dims.virtual_stages > 1 ? " / v" : ", as keel plan");
  std::string kinds;
  for (const auto& [kind, bytes] : facts.memory.items())
    if (bytes.get<size_t>())
      kinds += (kinds.empty() ? "" : ", ") + kind + " " +
               std::to_string(bytes.get<size_t>() / 1048576.0).substr(0, 6);
  // The smaller state tiers say so beside the bytes they save.
  const OptimSection& o = cfg_.optim;
  std::string tier;
  if (o.state_dtype == "bf16") tier = "bf16 moments";
  if (!o.master_weights) tier += std::string(tier.empty() ? "" : ", ") + "no fp32 master";
  if (!tier.empty()) tier = " (" + tier + ", stochastically rounded)";
  if (o.grad_dtype == "bf16") tier += " (bf16 gradients from fp32 buckets)";
  if (const optim::OffloadTier* t = run.step->store().tier())
    tier += "; on the offload tier: " + std::to_string(t->file_bytes() / 1048576.0).substr(0, 6) +
            " MiB in " +
            (t->host()     ? std::string("pinned host memory")
             : t->direct() ? t->dir() + " (O_DIRECT)"
                           : t->dir() + " (buffered: O_DIRECT refused)") +
            (run.step->store().offloaded(optim::ParamStore::Kind::kWorking)
                 ? ", the weights' shard with it"
                 : "");
  Log("keel: memory per rank (MiB): %s; total %.1f MiB%s", kinds.c_str(),
      run.memory_bytes / 1048576.0, tier.c_str());
  if (o.grad_dtype == "bf16" && dims.zero < 2) {
    // The buckets are the embeddings', the head's and two blocks': a model whose vocabulary
    // outweighs its blocks (a small GPT-2) pays more for them than the bf16 buffer saves.
    const size_t saved = facts.memory.value("grads", size_t(0)),
                 buckets = facts.memory.value("zero_buffers", size_t(0));
    if (buckets > saved)
      Log("keel: note: optim.grad_dtype = \"bf16\" costs %.1f MiB of fp32 buckets to save %.1f "
          "MiB here (the embeddings dominate this model); fp32 gradients take less memory",
          buckets / 1048576.0, saved / 1048576.0);
  }
  nlohmann::json event = {
      {"event", "memory"}, {"bytes", facts.memory}, {"layout", parallel::DimsName(dims)}};
  if (run.pipelined) {
    std::string per;
    for (double b : facts.stage_bytes)
      per += (per.empty() ? "" : ", ") + std::to_string(b / 1048576.0).substr(0, 6);
    Log("keel: memory per pipeline stage (MiB, the figures above are stage 0's): %s", per.c_str());
    event["stage_bytes"] = facts.stage_bytes;
  }
  if (events_) events_->Write(event);
  // Which data the run draws from, with each source's share, so a log says what was trained.
  const RunData& d = run.data;
  double total_weight = 0;
  for (double w : d.weights) total_weight += w;
  for (size_t i = 0; i < d.sources.size(); ++i)
    Log("keel: data source %zu: %s, weight %g (%.1f%%), %zu tokens", i, d.sources[i].path.c_str(),
        d.weights[i], 100 * d.weights[i] / total_weight, d.train_ds[i].size());
}

}  // namespace keel::train

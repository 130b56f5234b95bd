// The memory model. See memory.h and docs/PLAN.md for the sources of each term.
#include "keel/plan/memory.h"

#include <algorithm>

#include "keel/model/activations.h"
#include "keel/model/params.h"
#include "keel/parallel/pipeline_schedule.h"

namespace keel::plan {

BytesPerParam StateBytesPerParam(Precision p, Accounting a, bool bf16_moments, bool master,
                                 bool bf16_grads) {
  const double moments = bf16_moments ? 4 : 8;
  if (p == Precision::kFp32) return {4, 4, 0, moments};
  return {2, a == Accounting::kKeel && !bf16_grads ? 4.0 : 2.0, master ? 4.0 : 0.0, moments};
}

BytesPerParam StateBytesPerParam(const Job& j) {
  return StateBytesPerParam(j.precision, j.accounting, j.bf16_moments, j.master, j.bf16_grads);
}

StateMemory ModelStateBytes(double psi, const BytesPerParam& bpp, int zero, int dp) {
  StateMemory m;
  m.params = bpp.weights * psi / (zero >= 3 ? dp : 1);
  m.grads = bpp.grads * psi / (zero >= 2 ? dp : 1);
  m.master = bpp.master * psi / (zero >= 1 ? dp : 1);
  m.moments = bpp.moments * psi / (zero >= 1 ? dp : 1);
  return m;
}

double LayerActivationBytes(double s, double b, double h, double a, int t, bool sp, Recompute rc) {
  const double sbh = s * b * h;
  // Full recompute keeps only the layer's input: Table 2, "full recompute: 2sbh". With sequence
  // parallelism that input is itself split over the tp ranks (Section 4.2.2).
  if (rc == Recompute::kFull) return 2 * sbh / (sp ? t : 1);
  const double attn = 5 * a * s / (h * t);  // softmax, its dropout mask and output: 5as/(ht)
  const bool sel = rc == Recompute::kSelective;
  if (t == 1) {
    // Row "no parallelism": sbh(34 + 5as/h); selective drops the 5as/h term (sbh·34).
    return sbh * (34 + (sel ? 0 : attn));
  }
  if (sp) {
    // Rows "tp+sp: sbh(34/t + 5as/(ht))" and "tp+sp+selective: sbh(34/t)".
    return sbh * (34.0 / t + (sel ? 0 : attn));
  }
  // Rows "tp: sbh(10 + 24/t + 5as/(ht))" and "tp+selective: sbh(10 + 24/t)": the 10sbh of
  // LayerNorms and dropouts stay replicated on every tp rank.
  return sbh * (10 + 24.0 / t + (sel ? 0 : attn));
}

const char* ActivationRow(int t, bool sp, Recompute rc) {
  if (rc == Recompute::kFull)
    return sp && t > 1 ? "full recompute: 2sbh/t" : "full recompute: 2sbh";
  const bool sel = rc == Recompute::kSelective;
  if (t == 1) return sel ? "no parallelism+selective: sbh(34)" : "no parallelism: sbh(34+5as/h)";
  if (sp) return sel ? "tp+sp+selective: sbh(34/t)" : "tp+sp: sbh(34/t+5as/(ht))";
  return sel ? "tp+selective: sbh(10+24/t)" : "tp: sbh(10+24/t+5as/(ht))";
}

namespace {

// The sizes ParamsPerRank needs, from keel's own registry. Cached for the last model asked
// about: a search evaluates thousands of layouts of one model, and the 1T registry has 1500
// named tensors.
struct ParamSizes {
  double embed = 0, per_layer = 0, ln_f = 0, total = 0;
  double wte_replica = 0;      // the last stage's copy of a tied wte; 0 untied (lm_head is in ln_f)
  double trainable = 0;        // LoRA: the adapters; else total
  double trainable_whole = 0;  // LoRA: the adapter factors tensor parallelism does not cut
  double frozen_matmul = 0;    // LoRA: the base's matrix-product weights (no dW products)
};

const ParamSizes& Sizes(const ModelSpec& m) {
  thread_local ModelSpec key{"", -1, -1, -1, -1, -1};
  thread_local ParamSizes sizes;
  if (key.layers == m.layers && key.hidden == m.hidden && key.heads == m.heads &&
      key.vocab == m.vocab && key.seq == m.seq && key.family == m.family &&
      key.kv_heads == m.kv_heads && key.ffn == m.ffn && key.lora_rank == m.lora_rank &&
      key.lora_targets == m.lora_targets && key.lora_base == m.lora_base &&
      key.lora_dora == m.lora_dora)
    return sizes;
  const model::ModelConfig cfg = ToModelConfig(m);
  const auto layout = model::ParamLayout::Whole(cfg);
  sizes.embed = double(layout.layer_start(0));  // wte (+ GPT-2's wpe)
  sizes.per_layer = double(layout.layer_start(1) - layout.layer_start(0));
  sizes.ln_f = double(layout.total() - layout.layer_start(m.layers));
  sizes.wte_replica = cfg.tied() ? double(layout.Find("wte.weight").numel) : 0;
  sizes.total = double(layout.total());
  sizes.trainable = sizes.trainable_whole = 0;
  sizes.frozen_matmul = 0;
  for (const model::ParamInfo& p : layout.params()) {
    if (!model::IsLoraParam(p.name)) continue;
    sizes.trainable += double(p.numel);
    if (model::TpAxis(cfg, p.name) < 0) sizes.trainable_whole += double(p.numel);
  }
  if (m.lora_rank > 0) {
    sizes.frozen_matmul = double(model::MatmulParams(model::BaseModel(cfg)));
  } else {
    sizes.trainable = sizes.total;
  }
  key = m;
  return sizes;
}

}  // namespace

double TotalParams(const ModelSpec& m) { return Sizes(m).total; }
double TrainableParams(const ModelSpec& m) { return Sizes(m).trainable; }
double TrainableWholeUnderTp(const ModelSpec& m) { return Sizes(m).trainable_whole; }
double FrozenMatmulParams(const ModelSpec& m) { return Sizes(m).frozen_matmul; }

double ParamsPerRank(const ModelSpec& m, int tp, int pp) {
  // Sizes from keel's own registry, so that tp=pp=1 is exactly what keel allocates. With tp,
  // every tensor is counted as split by t: LayerNorm weights and some biases are really
  // replicated, under 0.1% of a layer at these widths.
  const ParamSizes& z = Sizes(m);
  const double layers = z.per_layer * (m.layers / pp);
  if (pp == 1) return (z.embed + layers + z.ln_f) / tp;
  // The first stage holds the embeddings; the last holds ln_f and (tied weights) its own copy of
  // wte for the classifier, as Megatron-LM does, or (untied: Llama) lm_head, counted in ln_f's
  // part. The busier of the two bounds the memory.
  return std::max(z.embed + layers, z.wte_replica + layers + z.ln_f) / tp;
}

parallel::StateTiers TiersOf(const Job& job) {
  parallel::StateTiers t;
  t.moment_bytes = job.bf16_moments ? 2 : 4;
  t.grad_bytes = job.bf16_grads ? 2 : 4;
  t.master = job.master;
  t.offload_chunk = size_t(job.offload_chunk);
  t.offload_host = job.offload_host;
  t.offload_params = job.offload_params;
  t.grad_comm = job.grad_comm;
  t.diloco = job.diloco_inner_steps > 0;
  t.diloco_streaming = t.diloco && job.diloco_streaming;
  return t;
}

MemoryBreakdown KeelStageMemory(const Job& job, const Layout& l, int stage) {
  const ModelSpec& m = job.model;
  MemoryBreakdown mem;
  mem.capacity = job.cluster.accel.memory_bytes;
  mem.headroom = std::max(1e9, 0.05 * mem.capacity);
  const DType dt = job.precision == Precision::kFp32 ? DType::kF32 : DType::kBF16;
  const model::ModelConfig cfg = ToModelConfig(m);
  // The rank's chunks as train::TrainStep builds them: virtual stage c·p + s of p·v.
  const int v = l.pp > 1 ? l.virtual_stages : 1;
  const std::vector<model::StageRange> chunks = model::RankChunks(cfg, l.pp, stage, v);
  // The store's and the ZeRO strategy's buffers, by the formula they allocate with. Every
  // tensor-parallel rank holds shards of the same sizes: rank 0's stands for all.
  parallel::StateTiers tiers = TiersOf(job);
  tiers.offload_params = tiers.offload_params && l.zero >= 3;  // below it, whole weights
  const parallel::StateShape shape =
      parallel::WithTiers(model::StateShapeOf(cfg, chunks, {l.tp, 0}, dt), tiers);
  const parallel::StateBytes b = parallel::StateBytesPerRank(shape, l);
  mem.state.offload = double(b.offload_buffers);
  mem.tier = double(b.tier);
  const int micro_batches = job.global_batch / (l.dp * l.micro_batch);
  // The update reads and writes the whole tier; the weights' shard is read again before each
  // segment's gather, in the forward and the backward of every micro-batch.
  mem.tier_traffic = 2 * mem.tier;
  if (shape.working_offloaded())
    mem.tier_traffic +=
        2.0 * micro_batches * 2 * double(parallel::Shard(shape.total, l.replicas(), 0).size);
  if (job.offload_host) {
    // The staging is host memory, not the device's; the link carries each chunk's gradients
    // down and its bf16 weights up (and down first, without a master).
    mem.state.offload = 0;
    const double held =
        double(l.zero >= 1 ? parallel::Shard(shape.total, l.replicas(), 0).size : shape.total);
    mem.tier_traffic = held * (shape.grad_bytes + 2 + (job.master ? 0 : 2));
  }
  mem.state.params = double(b.working + b.biases + b.quantized);
  mem.state.grads = double(b.grads);
  mem.state.master = double(b.master);
  mem.state.moments = double(b.moments);
  mem.comm_buffers = double(b.zero_buffers);
  // The exact arena the trainer allocates (one source of truth).
  const model::Recompute rc = l.recompute == Recompute::kNone        ? model::Recompute::kNone
                              : l.recompute == Recompute::kSelective ? model::Recompute::kAttn
                                                                     : model::Recompute::kFull;
  const std::vector<int> slots = parallel::PipelineSlots(l.pp, stage, v, micro_batches);
  for (int c = 0; c < v; ++c)
    mem.activations +=
        double(model::PlanActivations(cfg, l.micro_batch, m.seq / l.cp, dt, rc, &chunks[size_t(c)],
                                      slots[size_t(c)], l.tp, l.sp && l.tp > 1, l.cp, l.cp_comm)
                   .total_bytes);
  mem.exact_activations = true;
  return mem;
}

MemoryBreakdown EstimateMemory(const Job& job, const Layout& l) {
  if (job.accounting == Accounting::kKeel) {
    // Middle stages differ only in their slots, which fall with the stage: stage 1 bounds them.
    MemoryBreakdown worst = KeelStageMemory(job, l, 0);
    for (int s : {1, l.pp - 1})
      if (s > 0 && s < l.pp) {
        MemoryBreakdown b = KeelStageMemory(job, l, s);
        if (b.used() > worst.used()) worst = b;
      }
    return worst;
  }
  const ModelSpec& m = job.model;
  MemoryBreakdown mem;
  mem.capacity = job.cluster.accel.memory_bytes;
  mem.headroom = std::max(1e9, 0.05 * mem.capacity);
  const BytesPerParam bpp = StateBytesPerParam(job);
  const double psi = ParamsPerRank(m, l.tp, l.pp);
  mem.state = ModelStateBytes(psi, bpp, l.zero, l.replicas());
  const int micro_batches = job.global_batch / (l.dp * l.micro_batch);
  if (job.offload_chunk > 0) {  // the moments, and a bf16 run's master, go to disk
    const bool master = job.precision == Precision::kBf16;
    mem.tier = mem.state.moments + (master ? mem.state.master : 0);
    mem.state.moments = 0;
    if (master) mem.state.master = 0;
    mem.state.offload = 3 * job.offload_chunk;
    mem.tier_traffic = 2 * mem.tier;
    if (job.offload_params && l.zero >= 3) {
      mem.tier += mem.state.params;
      mem.tier_traffic += mem.state.params * (2 + 2.0 * micro_batches);  // as KeelStageMemory
      mem.state.params = 0;
    }
  }

  {
    // Korthikanti's formulas count 16-bit activations; fp32 doubles the stored values. Context
    // parallelism keeps s/cp rows of each sequence.
    const double scale = job.precision == Precision::kFp32 ? 2.0 : 1.0;
    const double s = double(m.seq) / l.cp;
    const double per_layer =
        scale * LayerActivationBytes(s, l.micro_batch, m.hidden, m.heads, l.tp, l.sp, l.recompute);
    const int stage_layers = m.layers / l.pp;
    // 1F1B: the first stage holds min(pp, m) micro-batches in flight (Section 4.2.3: L layers'
    // worth at pp ranks); the last stage holds one, plus the fp32 logits split over tp.
    const double first = per_layer * stage_layers * std::min(l.pp, micro_batches);
    const double logits = 4.0 * s * l.micro_batch * m.vocab / l.tp;
    const double last = per_layer * stage_layers + logits;
    mem.activations = l.pp == 1 ? first + logits : std::max(first, last);
  }

  // Gradient buckets for the dp all-reduce / reduce-scatter: two 25M-parameter buckets in flight
  // (PyTorch DDP's default size), never more than the gradients themselves.
  // (keel all-reduces in place; its ZeRO buffers are counted above.)
  if (l.replicas() > 1) mem.comm_buffers += 2 * std::min(psi, 25e6) * bpp.grads;
  // ZeRO-3 gathers each layer's weights before use and prefetches the next: two layers' worth.
  if (l.zero >= 3 && l.replicas() > 1) {
    const double per_layer_params = psi / std::max(1, m.layers / l.pp);
    mem.comm_buffers += 2 * per_layer_params * bpp.weights;
  }
  // keel's own sums beside the paper's (what StateBytesPerRank allocates, counted with the ZeRO
  // buffers there): DiLoCo's anchor and momentum (8 bytes a parameter, 16 streaming) and an int8
  // wire's fp32 residual (4 bytes a gradient element when there is a sum to make).
  if (job.diloco_inner_steps > 0) mem.comm_buffers += (job.diloco_streaming ? 16 : 8) * psi;
  if (job.grad_comm == parallel::GradWire::kInt8 && l.replicas() > 1) mem.comm_buffers += 4 * psi;
  return mem;
}

}  // namespace keel::plan

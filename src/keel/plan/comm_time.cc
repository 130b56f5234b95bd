// The communication and time model. Rank order is Megatron-LM's: tp innermost, then dp, then pp,
// so a group stays inside a node when its span (tp, tp*dp, world) fits in one.
#include "keel/plan/comm_time.h"

#include <algorithm>

#include "keel/model/params.h"
#include "keel/plan/memory.h"

namespace keel::plan {

namespace {

// Ring all-reduce sends 2(n-1)/n of the buffer per rank; all-gather and reduce-scatter (n-1)/n.
double Ring(int n) { return n > 1 ? double(n - 1) / n : 0.0; }

}  // namespace

CommVolume EstimateComm(const Job& job, const Layout& l) {
  const ModelSpec& m = job.model;
  const Cluster& cl = job.cluster;
  CommVolume c;
  const int micro_batches = job.global_batch / (l.dp * l.micro_batch);
  const double act_elem = job.precision == Precision::kFp32 ? 4 : 2;
  const double sbh_bytes = double(m.seq) * l.micro_batch * m.hidden * act_elem;

  // Tensor parallel (Megatron): two all-reduces in forward and two in backward per layer; sequence
  // parallelism replaces each by an all-gather plus a reduce-scatter, the same bytes. Full
  // recomputation repeats the forward's two.
  const int collectives = 4 + (l.recompute == Recompute::kFull ? 2 : 0);
  c.tp_bytes = collectives * 2 * Ring(l.tp) * sbh_bytes * (m.layers / l.pp) * micro_batches;
  // Pipeline: each micro-batch sends its activations forward and receives their gradient back;
  // with sequence parallelism only the local 1/t of the sequence crosses (scatter-gather).
  // Interleaving crosses every rank boundary v times per micro-batch.
  if (l.pp > 1) c.pp_bytes = 2 * sbh_bytes / (l.sp ? l.tp : 1) * micro_batches * l.virtual_stages;
  // Data parallel, per step: ZeRO 0 all-reduces the grads; ZeRO 1/2 reduce-scatter the grads and
  // all-gather the updated weights; ZeRO 3 also all-gathers the weights again for backward (the
  // ZeRO paper's 1.5x). keel's own stage 1 keeps the stage-0 all-reduce (every rank has all the
  // gradients) and adds the all-gather.
  const BytesPerParam bpp = StateBytesPerParam(job.precision, job.accounting);
  const double psi = ParamsPerRank(m, l.tp, l.pp);
  // Context parallelism's ranks hold the same parameters: the gradient group is dp x cp.
  const double r = Ring(l.replicas());
  // The gradients' bytes on the wire per element: [parallel] grad_comm's, where it is not fp32
  // (int8's block scales included).
  const double grad_wire =
      job.grad_comm == parallel::GradWire::kF32
          ? bpp.grads
          : double(parallel::WireBytes(job.grad_comm, size_t(1) << 20)) / double(size_t(1) << 20);
  if (m.lora_rank > 0) {
    // LoRA: the adapters' fp32 gradients are all-reduced, and at ZeRO 1 and 3 their fp32
    // master shards all-gathered; the frozen base sends nothing below ZeRO 3, where its packed
    // shards (model/segment_pack.h: the working weights, codes and scales) are all-gathered for
    // the forward and again for the backward. Under tp a rank holds its shard of the cut factors
    // and all of the whole ones, whose gradients the tp group sums first.
    const double whole = TrainableWholeUnderTp(m) / l.pp;
    const double adapters = (TrainableParams(m) / l.pp - whole) / l.tp + whole;
    const double lora_wire = job.grad_comm == parallel::GradWire::kF32 ? 4 : grad_wire;
    c.dp_bytes = 2 * r * adapters * lora_wire + (l.zero >= 1 ? r * adapters * 4 : 0);
    if (l.zero >= 3) {
      const DType dt = job.precision == Precision::kFp32 ? DType::kF32 : DType::kBF16;
      const model::ModelConfig cfg = ToModelConfig(m);
      c.dp_bytes +=
          2 * r *
          double(
              model::StateShapeOf(cfg, model::RankChunks(cfg, l.pp, 0, 1), {l.tp, 0}, dt).packed);
    }
    if (l.tp > 1) c.tp_bytes += 2 * Ring(l.tp) * whole * 4;
  } else if (l.zero == 0)
    c.dp_bytes = 2 * r * psi * grad_wire;
  else if (l.zero == 1 && job.accounting == Accounting::kKeel)
    c.dp_bytes = 2 * r * psi * grad_wire + r * psi * bpp.weights;
  else
    c.dp_bytes = r * psi * grad_wire + r * psi * bpp.weights * (l.zero >= 3 ? 2 : 1);

  // DiLoCo: one sum of the pseudo-gradients (gradient-sized, in the same format) per round.
  // Streaming's exchange is point-to-point (train/diloco.h): each replica sends its fragment to
  // every other one, dp - 1 copies where the ring sends 2(dp - 1)/dp: dp/2 times its bytes.
  if (job.diloco_inner_steps > 0) {
    c.dp_bytes /= job.diloco_inner_steps;
    if (job.diloco_streaming && l.dp > 2) c.dp_bytes *= l.dp / 2.0;
  }

  // Context parallelism, per layer and micro-batch: this rank's keys and values (B·s/cp rows of
  // 2·kv_heads/tp heads) go to the cp - 1 others forward, again in backward (and in a recomputed
  // forward), where the ring also sends their fp32 gradients cp times and the all-gather
  // reduce-scatters them (cp - 1) in the activations' dtype.
  if (l.cp > 1) {
    const double kv = double(l.micro_batch) * (double(m.seq) / l.cp) * 2.0 *
                      (m.kv_heads > 0 ? m.kv_heads : m.heads) * (double(m.hidden) / m.heads) / l.tp;
    const double passes = 2 + (l.recompute == Recompute::kNone ? 0 : 1);
    const double per_layer = l.cp_comm == parallel::CpComm::kRing
                                 ? passes * (l.cp - 1) * kv * act_elem + l.cp * kv * 4
                                 : (passes + 1) * (l.cp - 1) * kv * act_elem;
    c.cp_bytes = per_layer * (m.layers / l.pp) * micro_batches;
  }
  c.tp_intra = l.tp <= cl.per_node;
  c.cp_intra = l.tp * l.cp <= cl.per_node;
  c.dp_intra = l.tp * l.cp * l.dp <= cl.per_node;
  c.pp_intra = cl.world <= cl.per_node;
  auto bw = [&](bool intra) {
    return intra ? cl.accel.intra_bytes_per_s : cl.accel.inter_bytes_per_s;
  };
  c.tp_s = c.tp_bytes / bw(c.tp_intra);
  c.pp_s = c.pp_bytes / bw(c.pp_intra);
  c.dp_s = c.dp_bytes / bw(c.dp_intra);
  c.cp_s = c.cp_bytes / bw(c.cp_intra);
  return c;
}

double ModelFlopsPerToken(const ModelSpec& m, double n_params) {
  // A Llama's input embedding is a lookup, not a product (its lm_head is one). GPT-2's tied wte
  // is its classifier; its position table counts as in the papers' 6N.
  const double lookup =
      m.family == model::Family::kLlama ? double((m.vocab + 127) / 128 * 128) * m.hidden : 0.0;
  // LoRA's frozen matrices get no weight-gradient product: 2 of their 6 FLOPs per weight are not
  // work the run has to do (the trainer counts MFU the same way).
  return 6 * (n_params - lookup) - 2 * FrozenMatmulParams(m) + 12.0 * m.layers * m.hidden * m.seq;
}

double HardwareFlopsPerToken(const ModelSpec& m, double n_params, Recompute rc) {
  const double attn_fwd = 4.0 * m.layers * m.hidden * m.seq;
  double f = ModelFlopsPerToken(m, n_params);
  if (rc == Recompute::kFull) f += 2 * n_params + attn_fwd;
  if (rc == Recompute::kSelective) f += attn_fwd;
  return f;
}

double PipelineStageImbalance(const ModelSpec& m, int pp) {
  if (pp <= 1) return 1.0;
  // Per token, forward and backward: a block 6·(its parameters) + 12hs (GPT-2: 72h²; a Llama's
  // SwiGLU and grouped-query attention as sized), the classifier 6Vh (the embedding lookup is
  // free). Equal stages of blocks, the classifier on the last one.
  const model::ModelConfig c = ToModelConfig(m);
  const double h = m.hidden, head = 6.0 * m.vocab * h;
  const double block_params = h * c.qkv_dim() + h * h + h * (c.fc_dim() + c.ffn());
  const double block = 6 * block_params + 12 * h * m.seq;
  const double total = m.layers * block + head, last = double(m.layers / pp) * block + head;
  return pp * last / total;
}

StepTime EstimateTime(const Job& job, const Layout& l, const CommVolume& c, double tier_traffic) {
  const ModelSpec& m = job.model;
  const Accelerator& acc = job.cluster.accel;
  StepTime t;
  t.micro_batches = job.global_batch / (l.dp * l.micro_batch);
  t.bubble = PipelineBubble(l.pp, t.micro_batches, l.virtual_stages);
  const double n = TotalParams(m);
  const double tokens = double(job.global_batch) * m.seq;
  const double world = job.cluster.world;
  // fp32 matrix products run at the fp32 rate (TF32 on the GPUs: half of bf16), and MFU is taken
  // against the peak of the precision the run uses, as keel's trainer reports it.
  const double peak = PeakFlops(acc, job.precision == Precision::kFp32);
  t.compute_s = tokens * HardwareFlopsPerToken(m, n, l.recompute) / world / (peak * job.efficiency);
  // A pipeline runs at its busiest stage's pace: the last, which also has the classifier.
  t.compute_s *= PipelineStageImbalance(m, l.pp);
  // tp and pp transfers sit on the critical path; the dp traffic overlaps backward (about 2/3 of
  // the compute) and only its excess is exposed.
  const double dp_exposed = std::max(0.0, c.dp_s - t.compute_s * 2.0 / 3.0);
  // The ring's transfers overlap the attention blocks (12·L·h·s FLOPs per token forward and
  // backward, of which the causal mask leaves half); the all-gather waits before its one call.
  const double attn_s = tokens * 6.0 * m.layers * m.hidden * m.seq / world /
                        (peak * job.efficiency) * PipelineStageImbalance(m, l.pp);
  const double cp_exposed =
      l.cp_comm == parallel::CpComm::kRing ? std::max(0.0, c.cp_s - attn_s) : c.cp_s;
  t.exposed_comm_s = c.tp_s + c.pp_s + cp_exposed + dp_exposed;
  // The bubble stretches the pipelined part: (m + pp - 1) / m = 1 / (1 - bubble).
  const double sharing = job.offload_host ? 1 : std::min<double>(job.cluster.per_node, world);
  t.offload_s = tier_traffic * sharing / job.offload_bytes_per_s;
  t.step_s =
      (t.compute_s + c.tp_s + c.pp_s + cp_exposed) / (1 - t.bubble) + dp_exposed + t.offload_s;
  t.tokens_per_s = tokens / t.step_s;
  t.mfu = tokens * ModelFlopsPerToken(m, n) / (t.step_s * world * peak);
  return t;
}

}  // namespace keel::plan

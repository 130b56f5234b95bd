#include "keel/model/activations.h"

#include <algorithm>

#include "keel/core/error.h"

namespace keel::model {

Recompute ParseRecompute(const std::string& s) {
  if (s == "none") return Recompute::kNone;
  if (s == "attn") return Recompute::kAttn;
  if (s == "full") return Recompute::kFull;
  ThrowBadInput("[model] recompute: expected \"none\", \"attn\" or \"full\", got \"" + s + "\"");
}

const char* RecomputeName(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return "none";
    case Recompute::kAttn:
      return "attn";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

const ActivationBuffer& ActivationPlan::Find(const std::string& name) const {
  for (const auto& b : buffers)
    if (b.name == name) return b;
  ThrowRuntime("no activation buffer named \"" + name + "\"");
}

ActivationPlan PlanActivations(const ModelConfig& cfg, int B, int T, DType dtype,
                               Recompute recompute, const StageRange* stage, int slots, int tp,
                               bool sp, int cp, CpComm cp_comm) {
  ActivationPlan plan;
  const StageRange st = stage ? *stage : WholeModel(cfg);
  const size_t L = st.layers(), C = cfg.n_embd, BT = size_t(B) * T;
  // This rank's heads' channels and hidden units (tensor parallelism), and its heads.
  const size_t Cl = C / size_t(tp), NH = size_t(cfg.n_head / tp);
  // This rank's fused q, k, v columns, the MLP's first product's columns (GELU's input, or
  // SwiGLU's gate and up) and its hidden units.
  const size_t QKV = size_t(cfg.qkv_dim() / tp), FC = size_t(cfg.fc_dim() / tp);
  const size_t F = size_t(cfg.ffn() / tp);
  // LayerNorm saves a mean and an rstd per row, RMSNorm an rstd only.
  const bool means = !cfg.llama();
  // The rows of the residual stream this rank holds (sequence parallelism: its 1/tp of them).
  const size_t R = sp ? BT / size_t(tp) : BT;
  const size_t t = DTypeSize(dtype), f = 4, S = size_t(slots);
  auto add = [&](const char* name, size_t count, size_t elem_bytes, size_t elems) {
    ActivationBuffer b{name, count, elem_bytes, elems, plan.total_bytes};
    plan.total_bytes += (b.bytes() + 63) / 64 * 64;
    plan.buffers.push_back(b);
  };
  // Per layer and per slot where kept; one shared copy where recomputed in backward.
  const size_t attn_copies = recompute == Recompute::kNone ? L * S : 1;
  const size_t mlp_copies = recompute == Recompute::kFull ? 1 : L * S;
  // The residual stream: block inputs and the last block's output, per slot.
  add("resid", (L + 1) * S, t, R * C);
  add("ln1", attn_copies, t, R * C);
  if (means) add("ln1_mean", attn_copies, f, R);
  add("ln1_rstd", attn_copies, f, R);
  add("qkv", attn_copies, t, BT * QKV);
  add("atty", attn_copies, t, BT * Cl);
  add("att_lse", attn_copies, f, BT * NH);
  add("res2", mlp_copies, t, R * C);
  add("ln2", mlp_copies, t, R * C);
  if (means) add("ln2_mean", mlp_copies, f, R);
  add("ln2_rstd", mlp_copies, f, R);
  add("fch", mlp_copies, t, BT * FC);
  add("fch_gelu", mlp_copies, t, BT * F);
  if (st.last()) {
    // The last stage runs a micro-batch's head right before its backward: one copy serves.
    add("lnf", 1, t, R * C);
    if (means) add("lnf_mean", 1, f, R);
    add("lnf_rstd", 1, f, R);
    add("losses", 1, f, BT);
    // Each rank's log-sum-exp and target logit per row, gathered by the vocabulary shards.
    if (tp > 1) add("vocab_stats", 1, f, 2 * BT * size_t(tp + 1));
  }
  if (!st.last()) add("pipe_grad_in", S, t, R * C);
  if (!st.first()) add("pipe_grad_out", S, t, R * C);
  if (sp) add("gathered", 1, t, BT * C);
  // Backward's gradient buffers: one layer's worth, reused by every layer.
  add("dres", 1, t, R * C);
  add("dtmp", 1, t, BT * C);
  add("dqkv", 1, t, BT * QKV);
  add("dfch_gelu", 1, t, BT * F);
  add("dfch", 1, t, BT * FC);
  // Context parallelism: one layer's attention blocks and the keys and values in flight
  // (context_parallel.h).
  if (cp > 1)
    for (const CpBufferSize& b : CpBufferSizes(cp_comm, cp, BT, QKV, Cl, NH, t))
      add(b.name, 1, b.elem_bytes, b.elems);
  // LoRA: x·Aᵀ and its gradient for one product at a time (recomputed in backward); with
  // dropout also the masked input and its gradient (the widest input: C, or the rank's columns
  // of the attention output or of the MLP's hidden units).
  if (cfg.lora_rank > 0) {
    add("lora_h", 1, t, BT * size_t(cfg.lora_rank));
    add("lora_dh", 1, t, BT * size_t(cfg.lora_rank));
    if (cfg.lora_dropout > 0) {
      add("lora_x", 1, t, BT * std::max({C, Cl, F}));
      add("lora_dx", 1, t, BT * std::max({C, Cl, F}));
    }
  }
  // fp8 block products (fp8_products.h): one product's input, weight and output gradient as the
  // fp8 product sees them, at a time (each the widest of the block's four).
  if (cfg.fp8) {
    add("fp8_x", 1, t, BT * std::max({C, Cl, F}));
    add("fp8_w", 1, t, std::max({QKV * C, C * Cl, FC * C, C * F}));
    add("fp8_dy", 1, t, BT * std::max({QKV, C, FC}));
  }
  // DoRA: each adapted product's z = x·Wᵀ + s·(x·Aᵀ)·Bᵀ (its magnitude's gradient reads it) and
  // its row scales and inverse norms, kept as long as the product's output: the attention
  // sublayer's (q, k, v) as its other buffers, the rest as the MLP's (recompute "attn" does not
  // rerun the output projection). This rank's columns of the column-parallel products' z, and of
  // the row-parallel ones' (whole rows) its residual rows: R under sequence parallelism, whose
  // reduce-scatter leaves it those. And ∂loss/∂z of one product at a time.
  if (cfg.lora_dora) {
    const size_t widths[] = {QKV, C, FC, C};
    for (int k = 0; k < 4; ++k) {
      if (!(cfg.lora_targets & kLoraTargets[k])) continue;
      const size_t copies = k == 0 ? attn_copies : mlp_copies;
      const bool row_parallel = k == 1 || k == 3;
      add(kDoraZ[k], copies, t, (row_parallel ? R : BT) * widths[k]);
      add(kDoraScale[k], copies, f, 2 * widths[k]);
    }
    add("dora_dz", 1, t, BT * std::max({QKV, C, FC}));
  }
  // A quantized base: one block matrix at a time, dequantized before its product (the widest:
  // the fused q, k, v or the MLP's first product, by C input columns; or the MLP's last product).
  if (cfg.lora_base != BaseQuant::kNone)
    add("dequant", 1, t, std::max({QKV * C, FC * C, C * F, C * Cl}));
  return plan;
}

}  // namespace keel::model

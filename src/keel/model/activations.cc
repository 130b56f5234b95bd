#include "keel/model/activations.h"

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
                               Recompute recompute) {
  ActivationPlan plan;
  const size_t L = cfg.n_layer, C = cfg.n_embd, NH = cfg.n_head, BT = size_t(B) * T;
  const size_t t = DTypeSize(dtype), f = 4;
  auto add = [&](const char* name, size_t count, size_t elem_bytes, size_t elems) {
    ActivationBuffer b{name, count, elem_bytes, elems, plan.total_bytes};
    plan.total_bytes += (b.bytes() + 63) / 64 * 64;
    plan.buffers.push_back(b);
  };
  const size_t attn_copies = recompute == Recompute::kNone ? L : 1;
  const size_t mlp_copies = recompute == Recompute::kFull ? 1 : L;
  // The residual stream: block inputs 0..L-1 and the last block's output.
  add("resid", L + 1, t, BT * C);
  add("ln1", attn_copies, t, BT * C);
  add("ln1_mean", attn_copies, f, BT);
  add("ln1_rstd", attn_copies, f, BT);
  add("qkv", attn_copies, t, BT * 3 * C);
  add("atty", attn_copies, t, BT * C);
  add("att_lse", attn_copies, f, BT * NH);
  add("res2", mlp_copies, t, BT * C);
  add("ln2", mlp_copies, t, BT * C);
  add("ln2_mean", mlp_copies, f, BT);
  add("ln2_rstd", mlp_copies, f, BT);
  add("fch", mlp_copies, t, BT * 4 * C);
  add("fch_gelu", mlp_copies, t, BT * 4 * C);
  add("lnf", 1, t, BT * C);
  add("lnf_mean", 1, f, BT);
  add("lnf_rstd", 1, f, BT);
  add("losses", 1, f, BT);
  add("tokens", 1, 4, BT);
  add("targets", 1, 4, BT);
  // Backward's gradient buffers: one layer's worth, reused by every layer.
  add("dres", 1, t, BT * C);
  add("dtmp", 1, t, BT * C);
  add("dqkv", 1, t, BT * 3 * C);
  add("dfch_gelu", 1, t, BT * 4 * C);
  add("dfch", 1, t, BT * 4 * C);
  return plan;
}

}  // namespace keel::model

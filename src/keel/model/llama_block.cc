// Llama's transformer block, forward and backward, on the shared Transformer internals.
//
// Legend: B batch, T time, C channels, hs head size; per tensor-parallel rank NHl query heads
// (Cl = NHl·hs channels), NKVl key/value heads, QKVl = Cl + 2·NKVl·hs fused q, k, v columns, Fl
// hidden units. Block l reads resid[l] and writes resid[l+1]:
//   ln1 = RMSNorm(resid[l]); qkv = rope(ln1·[Wq; Wk; Wv]ᵀ); atty = attn(qkv)   (grouped-query)
//   res2 = resid[l] + atty·Woᵀ
//   ln2 = RMSNorm(res2); fch = ln2·[Wgate; Wup]ᵀ; h = silu(gate)·up; resid[l+1] = res2 + h·Wdownᵀ
// q, k and v (and gate and up) are adjacent in the parameter layout, and so are a tensor-parallel
// rank's shards of them, so each pair of products is one matrix product. Rotary positions are
// applied to q and k in place: attention's backward needs the rotated values, and the rotation's
// backward needs none. Tensor and sequence parallelism work as for GPT-2 (transformer.cc), the
// row-parallel products without biases.
#include <string>

#include "keel/model/adapted_products.h"
#include "keel/model/transformer_impl.h"

namespace keel::model::internal {
namespace {

// Block l's weights (working dtype; the products' as Impl::Mat finds them) and, when `grads`,
// gradients (fp32).
template <typename T>
struct LlamaParams {
  const T *ln1, *ln2;
  MatW<T> qkv, o, gate_up, down;
  float *d_ln1 = nullptr, *d_qkv = nullptr, *d_o = nullptr, *d_ln2 = nullptr, *d_gate_up = nullptr,
        *d_down = nullptr;
  LoraPair<T> qkv_lora, o_lora, gate_up_lora, down_lora;
};

template <typename T>
LlamaParams<T> Params(Transformer::Impl& m, int l, bool grads) {
  const int s = m.layout.block_segment(l);
  const T* w = static_cast<const T*>(m.acc->Weights(s));
  float* g = grads ? m.acc->Grads(s) : nullptr;
  const std::string h = "h." + std::to_string(l) + ".";
  const size_t C = size_t(m.cfg.n_embd);
  auto mat = [&](const char* n, size_t elems) {
    return m.Matrix(w, s, m.layout.Find(h + n), elems);
  };
  // A matrix product's weight gradient: none when frozen (the product is skipped).
  auto gm = [&](const char* n) { return m.WeightGrad(g, m.layout.Find(h + n), s); };
  auto gn = [&](const char* n) { return m.GradAt(g, m.layout.Find(h + n), s); };
  LlamaParams<T> p;
  p.ln1 = m.At(w, s, m.layout.Find(h + "ln_1.weight"));
  p.ln2 = m.At(w, s, m.layout.Find(h + "ln_2.weight"));
  p.qkv = mat("attn.q_proj.weight", size_t(m.QKVl) * C);
  p.o = mat("attn.o_proj.weight", C * size_t(m.Cl));
  p.gate_up = mat("mlp.gate_proj.weight", 2 * size_t(m.Fl) * C);
  p.down = mat("mlp.down_proj.weight", C * size_t(m.Fl));
  if (g) {
    p.d_ln1 = gn("ln_1.weight"), p.d_qkv = gm("attn.q_proj.weight");
    p.d_o = gm("attn.o_proj.weight"), p.d_ln2 = gn("ln_2.weight");
    p.d_gate_up = gm("mlp.gate_proj.weight"), p.d_down = gm("mlp.down_proj.weight");
  }
  p.qkv_lora = Lora<T>(m, l, kLoraQkv, w, g, s);
  p.o_lora = Lora<T>(m, l, kLoraProj, w, g, s);
  p.gate_up_lora = Lora<T>(m, l, kLoraFc, w, g, s);
  p.down_lora = Lora<T>(m, l, kLoraFcProj, w, g, s);
  return p;
}

template <typename T>
struct LlamaActs {
  T *in, *out, *ln1, *qkv, *atty, *res2, *ln2, *fch, *h;
  float *ln1_rstd, *lse, *ln2_rstd;
};

template <typename T>
LlamaActs<T> Acts(Transformer::Impl& m, int l, int slot) {
  const int i = l - m.stage.l0;
  LlamaActs<T> a;
  a.in = m.Resid<T>(slot, i), a.out = m.Resid<T>(slot, i + 1);
  a.ln1 = m.Act<T>("ln1", i, slot), a.qkv = m.Act<T>("qkv", i, slot);
  a.atty = m.Act<T>("atty", i, slot), a.res2 = m.Act<T>("res2", i, slot);
  a.ln2 = m.Act<T>("ln2", i, slot), a.fch = m.Act<T>("fch", i, slot);
  a.h = m.Act<T>("fch_gelu", i, slot);
  a.ln1_rstd = m.Act<float>("ln1_rstd", i, slot), a.lse = m.Act<float>("att_lse", i, slot);
  a.ln2_rstd = m.Act<float>("ln2_rstd", i, slot);
  return a;
}

template <typename T>
void AttentionSublayer(Transformer::Impl& m, const LlamaParams<T>& p, const LlamaActs<T>& a) {
  const int C = m.cfg.n_embd;
  KEEL_PROFILED("rmsnorm",
                m.be->RmsNormForward(a.ln1, a.ln1_rstd, a.in, p.ln1, m.R, C, m.cfg.norm_eps));
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln1));
  AdaptedForward(m, a.qkv, x, m.Mat(p.qkv), nullptr, C, m.QKVl, p.qkv_lora);
  KEEL_PROFILED("rope", m.Rope(a.qkv, /*backward=*/false));
  KEEL_PROFILED("attention_fwd", m.Attend(a.atty, a.lse, a.qkv));
}

template <typename T>
void Forward(Transformer::Impl& m, const LlamaParams<T>& p, const LlamaActs<T>& a) {
  const int BT = m.B * m.T, C = m.cfg.n_embd;
  AttentionSublayer(m, p, a);
  RowParallelForward<T>(m, a.res2, a.in, a.atty, m.Mat(p.o), nullptr, m.Cl, p.o_lora);
  KEEL_PROFILED("rmsnorm",
                m.be->RmsNormForward(a.ln2, a.ln2_rstd, a.res2, p.ln2, m.R, C, m.cfg.norm_eps));
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln2));
  AdaptedForward(m, a.fch, x, m.Mat(p.gate_up), nullptr, C, 2 * m.Fl, p.gate_up_lora);
  KEEL_PROFILED("swiglu", m.be->SwigluForward(a.h, a.fch, BT, m.Fl));
  RowParallelForward<T>(m, a.out, a.res2, a.h, m.Mat(p.down), nullptr, m.Fl, p.down_lora);
}

}  // namespace

template <typename T>
void LlamaBlockForward(Transformer::Impl& m, int l, int slot, bool attn_only) {
  const LlamaParams<T> p = Params<T>(m, l, false);
  const LlamaActs<T> a = Acts<T>(m, l, slot);
  if (attn_only)
    AttentionSublayer(m, p, a);
  else
    Forward(m, p, a);
}

template <typename T>
void LlamaBlockBackward(Transformer::Impl& m, int l, int slot, T* dres) {
  const int BT = m.B * m.T, C = m.cfg.n_embd;
  const LlamaParams<T> p = Params<T>(m, l, true);
  const LlamaActs<T> a = Acts<T>(m, l, slot);
  if (m.recompute == Recompute::kFull)
    Forward(m, p, a);
  else if (m.recompute == Recompute::kAttn)
    AttentionSublayer(m, p, a);
  T* dtmp = m.Act<T>("dtmp");
  T* dqkv = m.Act<T>("dqkv");
  T* dh = m.Act<T>("dfch_gelu");
  T* dfch = m.Act<T>("dfch");
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(dres));
  AdaptedBackward(m, dh, p.d_down, nullptr, x, a.h, m.Mat(p.down), m.Fl, C, p.down_lora);
  KEEL_PROFILED("swiglu", m.be->SwigluBackward(dfch, a.fch, dh, BT, m.Fl));
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln2));
  AdaptedBackward<T>(m, dtmp, p.d_gate_up, nullptr, dfch, x, m.Mat(p.gate_up), C, 2 * m.Fl,
                     p.gate_up_lora);
  KEEL_PROFILED("tp_comm", m.SumRows(dtmp, dtmp));
  KEEL_PROFILED("rmsnorm",
                m.be->RmsNormBackward(dres, p.d_ln2, dtmp, a.res2, p.ln2, a.ln2_rstd, m.R, C));
  KEEL_PROFILED("tp_comm", x = m.Whole(dres));
  AdaptedBackward(m, dtmp, p.d_o, nullptr, x, a.atty, m.Mat(p.o), m.Cl, C, p.o_lora);
  KEEL_PROFILED("attention_bwd", m.AttendBackward(dqkv, dtmp, a.qkv, a.atty, a.lse));
  KEEL_PROFILED("rope", m.Rope(dqkv, /*backward=*/true));
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln1));
  AdaptedBackward<T>(m, dtmp, p.d_qkv, nullptr, dqkv, x, m.Mat(p.qkv), C, m.QKVl, p.qkv_lora);
  KEEL_PROFILED("tp_comm", m.SumRows(dtmp, dtmp));
  KEEL_PROFILED("rmsnorm",
                m.be->RmsNormBackward(dres, p.d_ln1, dtmp, a.in, p.ln1, a.ln1_rstd, m.R, C));
}

template void LlamaBlockForward<float>(Transformer::Impl&, int, int, bool);
template void LlamaBlockForward<bf16>(Transformer::Impl&, int, int, bool);
template void LlamaBlockBackward<float>(Transformer::Impl&, int, int, float*);
template void LlamaBlockBackward<bf16>(Transformer::Impl&, int, int, bf16*);
template void LlamaBlockForward<f16>(Transformer::Impl&, int, int, bool);
template void LlamaBlockBackward<f16>(Transformer::Impl&, int, int, f16*);

}  // namespace keel::model::internal

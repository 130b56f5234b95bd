// GPT-2 forward and backward, one block at a time, in llm.c's shape.
//
// Legend: B batch, T time, C channels, NH heads, L layers, V vocabulary, Vp padded vocabulary.
// Block l reads resid[l] and writes resid[l+1]:
//   ln1 = LN(resid[l]); qkv = ln1·Wqkvᵀ + b; atty = attn(qkv); res2 = resid[l] + atty·Wprojᵀ + b
//   ln2 = LN(res2); fch = ln2·Wfcᵀ + b; fch_gelu = gelu(fch); resid[l+1] = res2 + fch_gelu·Wfcpᵀ +
//   b
// The residual adds are folded into the projections (MatmulForward's accumulate).
//
// Tensor parallelism (Megatron-LM): a rank holds NH/t heads (qkv, atty: 3C/t, C/t channels) and
// 4C/t hidden units (fch), the projections' matching input columns, and wte rows [v0, v0 + Vp/t).
// Each row-parallel projection leaves a partial sum: tp rank 0 seeds it with the residual and the
// bias, the others with zero, and one all-reduce completes it (g). In backward the column-parallel
// products leave partial input gradients, summed by one all-reduce each (f's backward). The
// LayerNorms and residual stream are whole and identical on every tp rank.
// Sequence parallelism keeps R = B·T/tp rows of the residual stream per rank instead (rows
// [tp_rank·R, (tp_rank + 1)·R)): the LayerNorms run on those, their outputs are all-gathered into
// one shared buffer before the column-parallel products (again in backward rather than kept), and
// the row-parallel partial sums are reduce-scattered instead of all-reduced: each rank seeds its
// own rows with its residual, the lead adds the bias to all rows.

#include "keel/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "keel/core/timer.h"
#include "keel/model/adapted_products.h"
#include "keel/model/fp8_products.h"
#include "keel/model/transformer_impl.h"

namespace keel::model {

namespace {

// Pointers of one block: weights W (working dtype), biases (fp32 master), gradients (fp32).
template <typename T>
struct BlockParams {
  const T *ln1w, *ln1b, *ln2w, *ln2b;
  MatW<T> qkvw, projw, fcw, fcpw;  // as Impl::Mat finds them
  const float *qkvb, *projb, *fcb, *fcpb;
  float *d_ln1w, *d_ln1b, *d_qkvw, *d_qkvb, *d_projw, *d_projb, *d_ln2w, *d_ln2b, *d_fcw, *d_fcb,
      *d_fcpw, *d_fcpb;
  internal::LoraPair<T> qkv_lora, proj_lora, fc_lora, fcp_lora;
};

template <typename T>
struct BlockActs {
  T *in, *out, *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu;
  float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
};

// Block l's pointers; gradients only when `grads` (backward), since asking for them may cost
// the strategy a zeroed scratch buffer.
template <typename T>
BlockParams<T> Block(Transformer::Impl& m, int l, bool grads) {
  const int s = m.layout.block_segment(l);
  const T* w = static_cast<const T*>(m.acc->Weights(s));
  const float* biases = std::is_same_v<T, float> ? nullptr : m.acc->Biases();
  float* g = grads ? m.acc->Grads(s) : nullptr;
  const std::string h = "h." + std::to_string(l) + ".";
  auto info = [&](const char* n) -> const ParamInfo& { return m.layout.Find(h + n); };
  auto W = [&](const char* n) { return m.At(w, s, info(n)); };
  const size_t C = size_t(m.cfg.n_embd), Cl = size_t(m.Cl);
  auto mat = [&](const char* n, size_t elems) { return m.Matrix(w, s, info(n), elems); };
  auto bias = [&](const char* n) -> const float* {
    if constexpr (std::is_same_v<T, float>)
      return W(n);
    else
      return biases + info(n).bias_index;
  };
  auto G = [&](const char* n) { return m.GradAt(g, info(n), s); };
  // A matrix product's weight or bias: none when frozen (the product is skipped).
  auto GM = [&](const char* n) { return m.WeightGrad(g, info(n), s); };
  BlockParams<T> p;
  p.ln1w = W("ln_1.weight"), p.ln1b = W("ln_1.bias");
  p.qkvw = mat("attn.c_attn.weight", 3 * Cl * C), p.qkvb = bias("attn.c_attn.bias");
  p.projw = mat("attn.c_proj.weight", C * Cl), p.projb = bias("attn.c_proj.bias");
  p.ln2w = W("ln_2.weight"), p.ln2b = W("ln_2.bias");
  p.fcw = mat("mlp.c_fc.weight", 4 * Cl * C), p.fcb = bias("mlp.c_fc.bias");
  p.fcpw = mat("mlp.c_proj.weight", C * 4 * Cl), p.fcpb = bias("mlp.c_proj.bias");
  p.d_ln1w = G("ln_1.weight"), p.d_ln1b = G("ln_1.bias");
  p.d_qkvw = GM("attn.c_attn.weight"), p.d_qkvb = GM("attn.c_attn.bias");
  p.d_projw = GM("attn.c_proj.weight"), p.d_projb = GM("attn.c_proj.bias");
  p.d_ln2w = G("ln_2.weight"), p.d_ln2b = G("ln_2.bias");
  p.d_fcw = GM("mlp.c_fc.weight"), p.d_fcb = GM("mlp.c_fc.bias");
  p.d_fcpw = GM("mlp.c_proj.weight"), p.d_fcpb = GM("mlp.c_proj.bias");
  p.qkv_lora = internal::Lora<T>(m, l, kLoraQkv, w, g, s);
  p.proj_lora = internal::Lora<T>(m, l, kLoraProj, w, g, s);
  p.fc_lora = internal::Lora<T>(m, l, kLoraFc, w, g, s);
  p.fcp_lora = internal::Lora<T>(m, l, kLoraFcProj, w, g, s);
  return p;
}

// Block l's activations (l global) for the micro-batch in `slot`.
template <typename T>
BlockActs<T> Acts(Transformer::Impl& m, int l, int slot) {
  const int i = l - m.stage.l0;
  BlockActs<T> a;
  a.in = m.Resid<T>(slot, i), a.out = m.Resid<T>(slot, i + 1);
  a.ln1 = m.Act<T>("ln1", i, slot), a.qkv = m.Act<T>("qkv", i, slot);
  a.atty = m.Act<T>("atty", i, slot);
  a.res2 = m.Act<T>("res2", i, slot), a.ln2 = m.Act<T>("ln2", i, slot);
  a.fch = m.Act<T>("fch", i, slot), a.fch_gelu = m.Act<T>("fch_gelu", i, slot);
  a.ln1_mean = m.Act<float>("ln1_mean", i, slot), a.ln1_rstd = m.Act<float>("ln1_rstd", i, slot);
  a.lse = m.Act<float>("att_lse", i, slot);
  a.ln2_mean = m.Act<float>("ln2_mean", i, slot), a.ln2_rstd = m.Act<float>("ln2_rstd", i, slot);
  return a;
}

template <typename T>
void AttentionSublayerForward(Transformer::Impl& m, const BlockParams<T>& p,
                              const BlockActs<T>& a) {
  const int C = m.cfg.n_embd, Cl = m.Cl;
  KEEL_PROFILED("layernorm", m.be->LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, a.in, p.ln1w,
                                                    p.ln1b, m.R, C));
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln1));
  internal::AdaptedForward(m, a.qkv, x, m.Mat(p.qkvw), p.qkvb, C, 3 * Cl, p.qkv_lora);
  KEEL_PROFILED("attention_fwd", m.Attend(a.atty, a.lse, a.qkv));
}

template <typename T>
void BlockForward(Transformer::Impl& m, const BlockParams<T>& p, const BlockActs<T>& a) {
  const int BT = m.B * m.T, C = m.cfg.n_embd, Cl = m.Cl;
  AttentionSublayerForward(m, p, a);
  internal::RowParallelForward(m, a.res2, a.in, a.atty, m.Mat(p.projw), p.projb, Cl, p.proj_lora);
  KEEL_PROFILED("layernorm", m.be->LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w,
                                                    p.ln2b, m.R, C));
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln2));
  internal::AdaptedForward(m, a.fch, x, m.Mat(p.fcw), p.fcb, C, 4 * Cl, p.fc_lora);
  KEEL_PROFILED("gelu", m.be->GeluForward(a.fch_gelu, a.fch, size_t(BT) * 4 * Cl));
  internal::RowParallelForward(m, a.out, a.res2, a.fch_gelu, m.Mat(p.fcpw), p.fcpb, 4 * Cl,
                               p.fcp_lora);
}

// dres holds ∂loss/∂resid[l+1] on entry and ∂loss/∂resid[l] on exit.
template <typename T>
void BlockBackward(Transformer::Impl& m, const BlockParams<T>& p, const BlockActs<T>& a, T* dres) {
  const int BT = m.B * m.T, C = m.cfg.n_embd, Cl = m.Cl;
  T* dtmp = m.Act<T>("dtmp");
  T* dqkv = m.Act<T>("dqkv");
  T* dfch_gelu = m.Act<T>("dfch_gelu");
  T* dfch = m.Act<T>("dfch");
  // The projections' biases are whole on every tp rank and so are their gradients: each rank has
  // all of dres (gathered under sequence parallelism). Each Whole() below overwrites the shared
  // buffer once its previous contents are consumed.
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(dres));
  internal::AdaptedBackward(m, dfch_gelu, p.d_fcpw, p.d_fcpb, x, a.fch_gelu, m.Mat(p.fcpw), 4 * Cl,
                            C, p.fcp_lora);
  KEEL_PROFILED("gelu", m.be->GeluBackward(dfch, a.fch, dfch_gelu, size_t(BT) * 4 * Cl));
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln2));
  internal::AdaptedBackward<T>(m, dtmp, p.d_fcw, p.d_fcb, dfch, x, m.Mat(p.fcw), C, 4 * Cl,
                               p.fc_lora);
  KEEL_PROFILED("tp_comm", m.SumRows(dtmp, dtmp));
  KEEL_PROFILED("layernorm", m.be->LayerNormBackward(dres, p.d_ln2w, p.d_ln2b, dtmp, a.res2, p.ln2w,
                                                     a.ln2_mean, a.ln2_rstd, m.R, C));
  KEEL_PROFILED("tp_comm", x = m.Whole(dres));
  internal::AdaptedBackward(m, dtmp, p.d_projw, p.d_projb, x, a.atty, m.Mat(p.projw), Cl, C,
                            p.proj_lora);
  KEEL_PROFILED("attention_bwd", m.AttendBackward(dqkv, dtmp, a.qkv, a.atty, a.lse));
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln1));
  internal::AdaptedBackward<T>(m, dtmp, p.d_qkvw, p.d_qkvb, dqkv, x, m.Mat(p.qkvw), C, 3 * Cl,
                               p.qkv_lora);
  KEEL_PROFILED("tp_comm", m.SumRows(dtmp, dtmp));
  KEEL_PROFILED("layernorm", m.be->LayerNormBackward(dres, p.d_ln1w, p.d_ln1b, dtmp, a.in, p.ln1w,
                                                     a.ln1_mean, a.ln1_rstd, m.R, C));
}

// Parameter `name` of the final segment (the final norm, Llama's lm_head): its weights in the
// working dtype, and with `grads` its gradient.
template <typename T>
const T* FinalWeight(Transformer::Impl& m, const char* name) {
  const int s = m.layout.final_segment();
  return m.At(static_cast<const T*>(m.acc->Weights(s)), s, m.layout.Find(name));
}
float* FinalGrad(Transformer::Impl& m, float* grads, const char* name) {
  return m.GradAt(grads, m.layout.Find(name), m.layout.final_segment());
}

// The embeddings' segment starts the layout of the stages that have one.
template <typename T>
const T* Wte(Transformer::Impl& m) {
  const int s = m.layout.embed_segment();
  return m.At(static_cast<const T*>(m.acc->Weights(s)), s, m.layout.Find("wte.weight"));
}

// The classifier's weights: GPT-2's tied wte, or Llama's lm_head.
template <typename T>
const T* Head(Transformer::Impl& m) {
  return m.cfg.tied() ? Wte<T>(m) : FinalWeight<T>(m, "lm_head.weight");
}

// The embedding (first stage), the stage's blocks, and the final LayerNorm into "lnf" (last).
template <typename T>
void StageForward(Transformer::Impl& m, int slot, const int32_t* tokens) {
  const int C = m.cfg.n_embd;
  m.slot = slot;
  ParamAccess& acc = *m.acc;
  if (m.stage.first()) {
    acc.Use(0, Pass::kForward);
    const T* e = static_cast<const T*>(acc.Weights(0));
    // Vocabulary-parallel: each rank looks up the tokens it holds, the lead adds the positions
    // (GPT-2's; Llama's are rotary, inside attention).
    T* emb = m.sp ? m.Act<T>("gathered") : m.Resid<T>(slot, 0);
    const T* wpe = m.lead && !m.cfg.llama() ? m.At(e, 0, m.layout.Find("wpe.weight")) : nullptr;
    const T* wte = m.At(e, 0, m.layout.Find("wte.weight"));
    KEEL_PROFILED("encoder", m.ForPositions([&](size_t row, int b, int t, int pos0) {
      m.be->EncoderForward(emb + row * C, tokens + row, wte, wpe ? wpe + size_t(pos0) * C : nullptr,
                           b, t, C, m.v0, m.v0 + m.Vl);
    }));
    KEEL_PROFILED("tp_comm", m.SumRows(emb, m.Resid<T>(slot, 0)));
  }
  for (int l = m.stage.l0; l < m.stage.l1; ++l) {
    const int s = m.layout.block_segment(l);
    acc.Use(s, Pass::kForward);
    if (m.cfg.llama())
      internal::LlamaBlockForward<T>(m, l, slot);
    else
      BlockForward(m, Block<T>(m, l, false), Acts<T>(m, l, slot));
    acc.Done(s, Pass::kForward);
  }
  if (!m.stage.last()) return;
  const int f = m.layout.final_segment(), e = m.layout.embed_segment();
  acc.Use(f, Pass::kForward);
  if (!m.stage.first() && m.cfg.tied()) acc.Use(e, Pass::kForward);  // wte, for the classifier
  const T* x = m.Resid<T>(slot, m.stage.layers());
  const T* lnfw = FinalWeight<T>(m, "ln_f.weight");
  if (m.cfg.llama())
    KEEL_PROFILED("rmsnorm", m.be->RmsNormForward(m.Act<T>("lnf"), m.Act<float>("lnf_rstd"), x,
                                                  lnfw, m.R, C, m.cfg.norm_eps));
  else
    KEEL_PROFILED("layernorm", m.be->LayerNormForward(m.Act<T>("lnf"), m.Act<float>("lnf_mean"),
                                                      m.Act<float>("lnf_rstd"), x, lnfw,
                                                      FinalWeight<T>(m, "ln_f.bias"), m.R, C));
}

// The end of a forward-only pass: the embeddings and final LayerNorm are no longer needed.
void EndForward(Transformer::Impl& m) {
  if (m.stage.last()) m.acc->Done(m.layout.final_segment(), Pass::kForward);
  if (m.uses_embed) m.acc->Done(m.layout.embed_segment(), Pass::kForward);
}

template <typename T>
double StageLoss(Transformer::Impl& m, const int32_t* targets) {
  const int BT = m.B * m.T, C = m.cfg.n_embd;
  float* losses = m.Act<float>("losses");
  const k::VocabShard vs = m.vocab_shard();
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(m.Act<T>("lnf")));
  KEEL_PROFILED("classifier", m.be->ClassifierForward(losses, x, Head<T>(m), targets, BT, C,
                                                      m.cfg.vocab_size, m.Vl, m.vocab(vs)));
  EndForward(m);
  return m.SumLosses(losses, BT);
}

template <typename T>
void ForwardLogits(Transformer::Impl& m, const int32_t* tokens, float* logits) {
  KEEL_CHECK(m.tp == 1, "ForwardLogits: the whole logits exist only without tensor parallelism");
  StageForward<T>(m, 0, tokens);
  const size_t n = size_t(m.B) * m.T * m.cfg.vocab_size;
  Buffer dev(*m.be, m.be->host_visible() ? 0 : 4 * n);
  float* out = m.be->host_visible() ? logits : dev.as<float>();
  KEEL_PROFILED("classifier", m.be->ClassifierLogits(out, m.Act<T>("lnf"), Head<T>(m), m.B * m.T,
                                                     m.cfg.n_embd, m.cfg.vocab_size));
  if (!m.be->host_visible()) m.be->ToHost(logits, out, 4 * n);
  EndForward(m);
}

template <typename T>
double StageBackward(Transformer::Impl& m, int slot, const int32_t* tokens, const int32_t* targets,
                     float dloss, const void* dout, void* din) {
  const int BT = m.B * m.T, C = m.cfg.n_embd;
  m.slot = slot;
  ParamAccess& acc = *m.acc;
  const int e = m.layout.embed_segment();
  float* ge = m.uses_embed ? acc.Grads(e) : nullptr;
  T* dres = m.Act<T>("dres");
  T* dtmp = m.Act<T>("dtmp");
  double loss = 0;
  if (m.stage.last()) {
    float* losses = m.Act<float>("losses");
    const k::VocabShard vs = m.vocab_shard();
    const int s = m.layout.final_segment();
    float* gf = acc.Grads(s);
    // A frozen classifier (LoRA's base) gets no weight gradient: its product is skipped.
    float* dhead = m.cfg.tied() ? m.WeightGrad(ge, m.layout.Find("wte.weight"), e)
                                : m.WeightGrad(gf, m.layout.Find("lm_head.weight"), s);
    const T* x = nullptr;
    KEEL_PROFILED("tp_comm", x = m.Whole(m.Act<T>("lnf")));
    // The head's own phase: on a small model it is most of the step's FLOPs. Host time, so on
    // an asynchronous device it is the launch and the rest shows as backward.
    const Timer head;
    const double tp_before = m.tp_ms;
    KEEL_PROFILED("classifier", m.be->ClassifierForwardBackward(
                                    losses, dtmp, dhead, x, Head<T>(m), targets, dloss, BT, C,
                                    m.cfg.vocab_size, m.Vl, m.vocab(vs)));
    m.head_ms += head.Millis() - (m.tp_ms - tp_before);
    KEEL_PROFILED("tp_comm", m.SumRows(dtmp, dtmp));  // the vocabulary shards' terms
    loss = m.SumLosses(losses, BT);
    m.be->Zero(dres, sizeof(T) * m.R * C);
    const T* lnf_in = m.Resid<T>(slot, m.stage.layers());
    const T* lnfw = FinalWeight<T>(m, "ln_f.weight");
    float* dlnfw = FinalGrad(m, gf, "ln_f.weight");
    if (m.cfg.llama())
      KEEL_PROFILED("rmsnorm", m.be->RmsNormBackward(dres, dlnfw, dtmp, lnf_in, lnfw,
                                                     m.Act<float>("lnf_rstd"), m.R, C));
    else
      KEEL_PROFILED("layernorm", m.be->LayerNormBackward(
                                     dres, dlnfw, FinalGrad(m, gf, "ln_f.bias"), dtmp, lnf_in, lnfw,
                                     m.Act<float>("lnf_mean"), m.Act<float>("lnf_rstd"), m.R, C));
    acc.GradsDone(s);
    acc.Done(s, Pass::kBackward);
  } else {
    m.be->Copy(dres, dout, sizeof(T) * m.R * C);
  }
  for (int l = m.stage.l1 - 1; l >= m.stage.l0; --l) {
    const int s = m.layout.block_segment(l);
    acc.Use(s, Pass::kBackward);
    if (m.cfg.llama()) {
      internal::LlamaBlockBackward<T>(m, l, slot, dres);
      acc.GradsDone(s);
      acc.Done(s, Pass::kBackward);
      continue;
    }
    BlockParams<T> p = Block<T>(m, l, true);
    BlockActs<T> a = Acts<T>(m, l, slot);
    if (m.recompute == Recompute::kFull)
      BlockForward(m, p, a);
    else if (m.recompute == Recompute::kAttn)
      AttentionSublayerForward(m, p, a);
    BlockBackward(m, p, a, dres);
    acc.GradsDone(s);
    acc.Done(s, Pass::kBackward);
  }
  if (m.stage.first()) {
    const T* x = nullptr;
    KEEL_PROFILED("tp_comm", x = m.Whole(dres));
    float* dwte = m.GradAt(ge, m.layout.Find("wte.weight"), e);
    float* dwpe = m.cfg.llama() ? nullptr : m.GradAt(ge, m.layout.Find("wpe.weight"), e);
    // LoRA's frozen embeddings have no gradient: the scatter-add is skipped.
    if (dwte)
      KEEL_PROFILED("encoder", m.ForPositions([&](size_t row, int b, int t, int pos0) {
        m.be->EncoderBackward(dwte, dwpe ? dwpe + size_t(pos0) * C : nullptr, x + row * C,
                              tokens + row, b, t, C, m.v0, m.v0 + m.Vl);
      }));
  } else {
    m.be->Copy(din, dres, sizeof(T) * m.R * C);
  }
  if (m.finishes_embed) {
    acc.GradsDone(e);
    acc.Done(e, Pass::kBackward);
  }
  return loss;
}

template <typename T>
double ForwardBackward(Transformer::Impl& m, const int32_t* tokens, const int32_t* targets,
                       float dloss) {
  StageForward<T>(m, 0, tokens);
  return StageBackward<T>(m, 0, tokens, targets, dloss, nullptr, nullptr);
}

}  // namespace

Transformer::Transformer(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
                         ParamAccess* params, const kernels::Backend& be)
    : Transformer(cfg, dtype, B, T, recompute, params, WholeModel(cfg), 1, be) {}

Transformer::Transformer(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
                         ParamAccess* params, const StageRange& stage, int slots,
                         const kernels::Backend& be)
    : Transformer(cfg, dtype, B, T, recompute, params, ParamLayout::Stage(cfg, stage), stage, slots,
                  {}, be) {}

Transformer::Transformer(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
                         ParamAccess* params, const ParamLayout& layout, const StageRange& stage,
                         int slots, const LayerGroups& groups, const kernels::Backend& be) {
  Validate(cfg);
  const long whole_T = long(T) * (groups.cp ? groups.cp->size() : 1);
  if (whole_T > cfg.block_size)
    ThrowBadInput("[data] seq_len: " + std::to_string(whole_T) +
                  " is longer than the model's context (block_size " +
                  std::to_string(cfg.block_size) + ")");
  impl_ = std::make_unique<Impl>(be, cfg, dtype, B, T, recompute, layout, stage, slots, groups);
  if (params == nullptr) {
    impl_->dense = std::make_unique<DenseParams>(impl_->layout, dtype, be);
    params = impl_->dense.get();
  }
  impl_->acc = params;
  internal::Fp8Setup(*impl_);
}
Transformer::~Transformer() = default;

std::vector<float> Transformer::Fp8StepAmax() const { return internal::Fp8StepAmax(*impl_); }
std::vector<std::string> Transformer::Fp8EndStep(const std::vector<float>& amax) {
  return internal::Fp8EndStep(*impl_, amax);
}
void Transformer::SetFp8Observe(bool on) { impl_->fp8.observe = on; }
size_t Transformer::Fp8StateFloats() const { return internal::Fp8StateFloats(*impl_); }
void Transformer::Fp8SaveState(float* out) const { internal::Fp8SaveState(*impl_, out); }
void Transformer::Fp8LoadState(const float* in) { internal::Fp8LoadState(*impl_, in); }
int Transformer::fp8_blocks() const {
  const Impl& m = *impl_;
  if (!m.fp8.on) return 0;
  int n = 0;
  for (int l = m.stage.l0; l < m.stage.l1; ++l)
    n += l != 0 && l != m.cfg.n_layer - 1 && !m.fp8.bf16_block[size_t(l - m.stage.l0)];
  return n;
}

const ModelConfig& Transformer::config() const { return impl_->cfg; }
const ParamLayout& Transformer::layout() const { return impl_->layout; }
const ActivationPlan& Transformer::activation_plan() const { return impl_->plan; }
DType Transformer::dtype() const { return impl_->dtype; }
const kernels::Backend& Transformer::backend() const { return *impl_->be; }
int Transformer::batch() const { return impl_->B; }
int Transformer::seq_len() const { return impl_->T; }
int Transformer::slots() const { return impl_->slots; }
double Transformer::tp_wait_ms() const { return impl_->tp_ms; }
double Transformer::tp_bytes() const { return impl_->tp_bytes; }
double Transformer::head_ms() const { return impl_->head_ms; }
double Transformer::cp_wait_ms() const { return impl_->cp_stats.wait_ms; }
double Transformer::cp_bytes() const { return impl_->cp_stats.bytes; }
void Transformer::ResetStepStats() {
  impl_->tp_ms = impl_->tp_bytes = impl_->head_ms = 0;
  impl_->cp_stats = {};
}

DenseParams& Transformer::Dense() const {
  KEEL_CHECK(impl_->dense != nullptr, "Transformer: parameters are held by its ParamAccess");
  return *impl_->dense;
}
float* Transformer::master() { return Dense().master.as<float>(); }
float* Transformer::grads() { return Dense().grads.as<float>(); }
bf16* Transformer::working_bf16() {
  return impl_->dtype == DType::kBF16 ? Dense().working.as<bf16>() : nullptr;
}
void Transformer::ZeroGrads() { impl_->be->Zero(grads(), Dense().grads.bytes()); }
void Transformer::SyncWorking() { Dense().SyncWorking(); }

void Transformer::SetDocumentMask(int eos_id) { impl_->doc_eos = eos_id; }
void Transformer::SetFrozen(const std::vector<bool>& frozen) { impl_->frozen = frozen; }
void Transformer::SetDropout(int slot, uint64_t key, uint64_t row0) {
  impl_->slot_dropout.at(size_t(slot)) = {true, key, row0};
}
void Transformer::ClearDropout() {
  for (auto& d : impl_->slot_dropout) d = {};
}

namespace {

// Calls f with a value of the C++ type of the run's activations (float, bf16 or f16).
template <typename F>
decltype(auto) ByDType(DType t, F&& f) {
  if (t == DType::kF32) return f(float{});
  if (t == DType::kBF16) return f(bf16{});
  return f(f16{});
}

}  // namespace

double Transformer::ForwardBackward(const int32_t* tokens, const int32_t* targets, float dloss) {
  impl_->dropout = impl_->slot_dropout[0];
  impl_->NoteDocuments(tokens);
  tokens = impl_->Ids(tokens, impl_->tokens);
  targets = impl_->Ids(targets, impl_->targets);
  return ByDType(impl_->dtype, [&](auto z) {
    return model::ForwardBackward<decltype(z)>(*impl_, tokens, targets, dloss);
  });
}

double Transformer::Forward(const int32_t* tokens, const int32_t* targets) {
  impl_->NoteDocuments(tokens);
  tokens = impl_->Ids(tokens, impl_->tokens);
  impl_->dropout = {};
  ByDType(impl_->dtype, [&](auto z) { model::StageForward<decltype(z)>(*impl_, 0, tokens); });
  return StageLoss(targets);
}

size_t Transformer::boundary_elems() const { return size_t(impl_->R) * impl_->cfg.n_embd; }
void* Transformer::StageInput(int slot) { return impl_->Resid<char>(slot, 0); }
const void* Transformer::StageOutput(int slot) {
  return impl_->Resid<char>(slot, impl_->stage.layers());
}

void* Transformer::PipeGradIn(int slot) { return impl_->Act<char>("pipe_grad_in", 0, slot); }
void* Transformer::PipeGradOut(int slot) { return impl_->Act<char>("pipe_grad_out", 0, slot); }

void Transformer::StageForward(int slot, const int32_t* tokens) {
  impl_->dropout = impl_->slot_dropout.at(size_t(slot));
  impl_->NoteDocuments(tokens);
  tokens = impl_->Ids(tokens, impl_->tokens);
  ByDType(impl_->dtype, [&](auto z) { model::StageForward<decltype(z)>(*impl_, slot, tokens); });
}

double Transformer::StageBackward(int slot, const int32_t* tokens, const int32_t* targets,
                                  float dloss, const void* dout, void* din) {
  impl_->dropout = impl_->slot_dropout.at(size_t(slot));
  impl_->NoteDocuments(tokens);
  tokens = impl_->Ids(tokens, impl_->tokens);
  targets = impl_->Ids(targets, impl_->targets);
  return ByDType(impl_->dtype, [&](auto z) {
    return model::StageBackward<decltype(z)>(*impl_, slot, tokens, targets, dloss, dout, din);
  });
}

double Transformer::StageLoss(const int32_t* targets) {
  targets = impl_->Ids(targets, impl_->targets);
  return ByDType(impl_->dtype,
                 [&](auto z) { return model::StageLoss<decltype(z)>(*impl_, targets); });
}

void Transformer::ForwardLogits(const int32_t* tokens, float* logits) {
  impl_->NoteDocuments(tokens);
  // Host ids, uploaded where the backend's memory is not the host's (the embedding reads them
  // there): ForwardLogits on a GPU read host memory before this.
  tokens = impl_->Ids(tokens, impl_->tokens);
  impl_->dropout = {};
  ByDType(impl_->dtype, [&](auto z) { model::ForwardLogits<decltype(z)>(*impl_, tokens, logits); });
}

}  // namespace keel::model

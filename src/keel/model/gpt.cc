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

#include "keel/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "keel/core/buffer.h"
#include "keel/core/error.h"
#include "keel/kernels/attention.h"
#include "keel/kernels/classifier.h"
#include "keel/kernels/encoder.h"
#include "keel/kernels/gelu.h"
#include "keel/kernels/layernorm.h"
#include "keel/kernels/matmul.h"
#include "keel/kernels/profile.h"
#include "keel/parallel/comm_wait.h"

namespace keel::model {

namespace k = keel::kernels;

// Times a kernel call under `label` when profiling is on (benchmarks only).
#define KEEL_PROFILED(label, call) \
  do {                             \
    k::ProfileScope scope_(label); \
    call;                          \
  } while (0)

// The parameters of a model that owns them (tests, the PyTorch oracle, evaluation): every
// segment resident, gradients accumulated in place. The trainer brings its own ParamAccess.
class DenseParams final : public ParamAccess {
 public:
  DenseParams(const ParamLayout& layout, DType dtype)
      : layout_(layout),
        dtype_(dtype),
        master(layout.total() * 4),
        grads(layout.total() * 4),
        working(dtype == DType::kBF16 ? layout.total() * 2 : 0),
        biases(dtype == DType::kBF16 ? layout.n_bias() * 4 : 0) {
    std::memset(master.data(), 0, master.bytes());
    std::memset(grads.data(), 0, grads.bytes());
  }

  const void* Weights(int s) override {
    const size_t off = layout_.segment_start(s);
    return dtype_ == DType::kF32 ? static_cast<const void*>(master.as<float>() + off)
                                 : static_cast<const void*>(working.as<bf16>() + off);
  }
  const float* Biases() override { return biases.as<float>(); }
  float* Grads(int s) override { return grads.as<float>() + layout_.segment_start(s); }

  void SyncWorking() {
    if (dtype_ != DType::kBF16) return;
    ConvertF32ToBf16(working.as<bf16>(), master.as<float>(), layout_.total());
    for (const ParamInfo& p : layout_.params())
      if (p.bias_index != SIZE_MAX)
        std::memcpy(biases.as<float>() + p.bias_index, master.as<float>() + p.offset, p.numel * 4);
  }

 private:
  const ParamLayout& layout_;
  DType dtype_;

 public:
  Buffer master, grads, working, biases;
};

struct GptModel::Impl {
  ModelConfig cfg;
  DType dtype;
  int B, T;
  Recompute recompute;
  StageRange stage;
  int slots;
  ParamLayout layout;
  bool uses_embed, finishes_embed;
  ActivationPlan plan;
  Buffer arena;
  std::unique_ptr<DenseParams> dense;  // when the model owns its parameters
  ParamAccess* acc = nullptr;
  // Tensor parallelism: tp ranks, this one's shard, its heads and channels, its vocabulary rows.
  TensorParallel tpg;
  int tp, tp_rank, NHl, Cl, Vl, v0;
  bool lead;  // tp rank 0: adds the replicated biases (and without sp the residual) into sums
  bool sp;    // sequence parallelism: R of the B·T rows from row0
  int R, row0;
  double tp_ms = 0, tp_bytes = 0;

  Impl(const ModelConfig& c, DType d, int b, int t, Recompute r, const ParamLayout& lay,
       const StageRange& st, int sl, const TensorParallel& tpar)
      : cfg(c),
        dtype(d),
        B(b),
        T(t),
        recompute(r),
        stage(st),
        slots(sl),
        layout(lay),
        uses_embed(st.first() || st.last()),
        // The rank's lowest chunk runs its last backward: the embeddings' gradients (the
        // classifier's too, on the last rank) are final only then.
        finishes_embed(lay.embed_segment() >= 0 && st.l0 == lay.chunks().front().l0),
        plan(PlanActivations(c, b, t, d, r, &st, sl, lay.tp().size,
                             tpar.sequence && lay.tp().size > 1)),
        arena(plan.total_bytes),
        tpg(tpar),
        tp(lay.tp().size),
        tp_rank(lay.tp().rank),
        NHl(c.n_head / tp),
        Cl(c.n_embd / tp),
        Vl(c.padded_vocab() / tp),
        v0(tp_rank * Vl),
        lead(tp_rank == 0),
        sp(tpar.sequence && tp > 1),
        R(sp ? b * t / tp : b * t),
        row0(sp ? tp_rank * R : 0) {
    KEEL_CHECK(!sp || (b * t) % tp == 0, "GptModel: sequence parallelism needs tp | B·T");
    std::memset(arena.data(), 0, arena.bytes());
    KEEL_CHECK(tp == 1 || (tpg.comm && tpg.comm->size() == tp && tpg.comm->rank() == tp_rank),
               "GptModel: the tensor-parallel group does not match the layout's shard");
  }

  // Completes a partial sum over the tp ranks, in place (`n` elements of the model's dtype).
  void TpSum(void* data, size_t n) {
    if (tp == 1) return;
    auto w = tpg.comm->AllReduceSumAsync(data, n, dtype);
    tp_ms += parallel::WaitOrLost(*w, tpg.timeout_s, "a tensor-parallel all-reduce");
    tp_bytes += double(n * DTypeSize(dtype));
  }

  // Sequence parallelism: every rank's R rows of `mine` → all B·T rows in `all`, in rank order.
  void GatherRows(const void* mine, void* all) {
    const size_t n = size_t(R) * cfg.n_embd;
    auto w = tpg.comm->AllGatherAsync(mine, all, std::vector<size_t>(size_t(tp), n), dtype);
    tp_ms += parallel::WaitOrLost(*w, tpg.timeout_s, "a sequence-parallel all-gather");
    tp_bytes += double(n * DTypeSize(dtype));
  }
  // `x` (this rank's rows) as all B·T rows, for a product over the whole sequence: itself, or
  // gathered into the shared buffer under sequence parallelism.
  template <typename U>
  const U* Whole(const U* x) {
    if (!sp) return x;
    U* all = Act<U>("gathered");
    GatherRows(x, all);
    return all;
  }
  // Completes a partial sum of all B·T rows (`all`): summed in place without sp; under sp, this
  // rank's rows of the sum into `mine` (may be `all`: then at its start).
  void SumRows(void* all, void* mine) {
    if (!sp) return TpSum(all, size_t(B) * T * cfg.n_embd);
    const size_t n = size_t(R) * cfg.n_embd;
    auto w = tpg.comm->ReduceScatterSumAsync(all, mine, std::vector<size_t>(size_t(tp), n), dtype);
    tp_ms += parallel::WaitOrLost(*w, tpg.timeout_s, "a sequence-parallel reduce-scatter");
    tp_bytes += double(n * size_t(tp) * DTypeSize(dtype));
  }

  // The vocabulary shards' per-row statistics → the whole vocabulary's (kernels::VocabShard).
  void CombineVocabStats(float* lse, float* target_logit, int rows) {
    float* mine = Act<float>("vocab_stats");
    float* all = mine + 2 * size_t(rows);
    std::memcpy(mine, lse, 4 * size_t(rows));
    std::memcpy(mine + rows, target_logit, 4 * size_t(rows));
    auto w = tpg.comm->AllGatherAsync(mine, all, 2 * size_t(rows));
    tp_ms += parallel::WaitOrLost(*w, tpg.timeout_s, "the vocabulary-parallel loss's all-gather");
    tp_bytes += 8.0 * rows;
    for (int r = 0; r < rows; ++r) {
      float mx = -INFINITY, sum = 0, tl = 0;
      for (int k = 0; k < tp; ++k) mx = std::max(mx, all[size_t(k) * 2 * rows + r]);
      for (int k = 0; k < tp; ++k) {
        sum += std::exp(all[size_t(k) * 2 * rows + r] - mx);
        tl += all[size_t(k) * 2 * rows + rows + r];
      }
      lse[r] = mx + std::log(sum);
      target_logit[r] = tl;
    }
  }
  k::VocabShard vocab_shard() {
    return {v0, [this](float* l, float* t, int n) { CombineVocabStats(l, t, n); }};
  }
  const k::VocabShard* vocab(const k::VocabShard& vs) const { return tp > 1 ? &vs : nullptr; }

  // Buffer `name` of local layer `copy` (0-based within the stage) of micro-batch `slot`; shared
  // buffers (one copy) whatever the layer and slot.
  template <typename U>
  U* Act(const char* name, int copy = 0, int slot = 0) const {
    const ActivationBuffer& b = plan.Find(name);
    const size_t idx = b.count == 1 ? 0 : size_t(slot) * (b.count / size_t(slots)) + size_t(copy);
    return reinterpret_cast<U*>(arena.as<char>() + b.offset + idx * b.elems * b.elem_bytes);
  }
  template <typename U>
  U* Resid(int slot, int copy) const {
    return Act<U>("resid", copy, slot);
  }
};

namespace {

// Pointers of one block: weights W (working dtype), biases (fp32 master), gradients (fp32).
template <typename T>
struct BlockParams {
  const T *ln1w, *ln1b, *qkvw, *projw, *ln2w, *ln2b, *fcw, *fcpw;
  const float *qkvb, *projb, *fcb, *fcpb;
  float *d_ln1w, *d_ln1b, *d_qkvw, *d_qkvb, *d_projw, *d_projb, *d_ln2w, *d_ln2b, *d_fcw, *d_fcb,
      *d_fcpw, *d_fcpb;
};

template <typename T>
struct BlockActs {
  T *in, *out, *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu;
  float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd;
};

// Block l's pointers; gradients only when `grads` (backward), since asking for them may cost
// the strategy a zeroed scratch buffer.
template <typename T>
BlockParams<T> Block(GptModel::Impl& m, int l, bool grads) {
  const int s = m.layout.block_segment(l);
  const size_t base = m.layout.segment_start(s);
  const T* w = static_cast<const T*>(m.acc->Weights(s));
  const float* biases = std::is_same_v<T, float> ? nullptr : m.acc->Biases();
  float* g = grads ? m.acc->Grads(s) : nullptr;
  const std::string h = "h." + std::to_string(l) + ".";
  auto info = [&](const char* n) -> const ParamInfo& { return m.layout.Find(h + n); };
  auto W = [&](const char* n) { return w + (info(n).offset - base); };
  auto bias = [&](const char* n) -> const float* {
    if constexpr (std::is_same_v<T, float>)
      return W(n);
    else
      return biases + info(n).bias_index;
  };
  auto G = [&](const char* n) { return g ? g + (info(n).offset - base) : nullptr; };
  BlockParams<T> p;
  p.ln1w = W("ln_1.weight"), p.ln1b = W("ln_1.bias");
  p.qkvw = W("attn.c_attn.weight"), p.qkvb = bias("attn.c_attn.bias");
  p.projw = W("attn.c_proj.weight"), p.projb = bias("attn.c_proj.bias");
  p.ln2w = W("ln_2.weight"), p.ln2b = W("ln_2.bias");
  p.fcw = W("mlp.c_fc.weight"), p.fcb = bias("mlp.c_fc.bias");
  p.fcpw = W("mlp.c_proj.weight"), p.fcpb = bias("mlp.c_proj.bias");
  p.d_ln1w = G("ln_1.weight"), p.d_ln1b = G("ln_1.bias");
  p.d_qkvw = G("attn.c_attn.weight"), p.d_qkvb = G("attn.c_attn.bias");
  p.d_projw = G("attn.c_proj.weight"), p.d_projb = G("attn.c_proj.bias");
  p.d_ln2w = G("ln_2.weight"), p.d_ln2b = G("ln_2.bias");
  p.d_fcw = G("mlp.c_fc.weight"), p.d_fcb = G("mlp.c_fc.bias");
  p.d_fcpw = G("mlp.c_proj.weight"), p.d_fcpb = G("mlp.c_proj.bias");
  return p;
}

// Block l's activations (l global) for the micro-batch in `slot`.
template <typename T>
BlockActs<T> Acts(GptModel::Impl& m, int l, int slot) {
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
void AttentionSublayerForward(GptModel::Impl& m, const BlockParams<T>& p, const BlockActs<T>& a) {
  const int BT = m.B * m.T, C = m.cfg.n_embd, Cl = m.Cl;
  KEEL_PROFILED("layernorm",
                k::LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, a.in, p.ln1w, p.ln1b, m.R, C));
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln1));
  KEEL_PROFILED("matmul_fwd", k::MatmulForward(a.qkv, x, p.qkvw, p.qkvb, BT, C, 3 * Cl));
  KEEL_PROFILED("attention_fwd", k::AttentionForward(a.atty, a.lse, a.qkv, m.B, m.T, Cl, m.NHl));
}

// out = residual + inp·weightᵀ + bias over the tp ranks: the lead rank seeds the residual and the
// bias, the others zero, and the all-reduce sums the partial products. Under sequence parallelism
// each rank seeds its own rows' residual into the shared buffer, and the reduce-scatter leaves
// each its rows of the sum.
template <typename T>
void RowParallelForward(GptModel::Impl& m, T* out, const T* residual, const T* inp, const T* weight,
                        const float* bias, int K) {
  const int BT = m.B * m.T, C = m.cfg.n_embd;
  T* sum = m.sp ? m.Act<T>("gathered") : out;
  if (m.sp) {
    std::memset(sum, 0, sizeof(T) * BT * C);
    std::memcpy(sum + size_t(m.row0) * C, residual, sizeof(T) * m.R * C);
  } else if (m.lead) {
    std::memcpy(out, residual, sizeof(T) * BT * C);
  } else {
    std::memset(out, 0, sizeof(T) * BT * C);
  }
  KEEL_PROFILED("matmul_fwd", k::MatmulForward(sum, inp, weight, m.lead ? bias : nullptr, BT, K, C,
                                               /*accumulate=*/true));
  KEEL_PROFILED("tp_comm", m.SumRows(sum, out));
}

template <typename T>
void BlockForward(GptModel::Impl& m, const BlockParams<T>& p, const BlockActs<T>& a) {
  const int BT = m.B * m.T, C = m.cfg.n_embd, Cl = m.Cl;
  AttentionSublayerForward(m, p, a);
  RowParallelForward(m, a.res2, a.in, a.atty, p.projw, p.projb, Cl);
  KEEL_PROFILED("layernorm",
                k::LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p.ln2w, p.ln2b, m.R, C));
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln2));
  KEEL_PROFILED("matmul_fwd", k::MatmulForward(a.fch, x, p.fcw, p.fcb, BT, C, 4 * Cl));
  KEEL_PROFILED("gelu", k::GeluForward(a.fch_gelu, a.fch, size_t(BT) * 4 * Cl));
  RowParallelForward(m, a.out, a.res2, a.fch_gelu, p.fcpw, p.fcpb, 4 * Cl);
}

// dres holds ∂loss/∂resid[l+1] on entry and ∂loss/∂resid[l] on exit.
template <typename T>
void BlockBackward(GptModel::Impl& m, const BlockParams<T>& p, const BlockActs<T>& a, T* dres) {
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
  KEEL_PROFILED("matmul_bwd", k::MatmulBackward(dfch_gelu, p.d_fcpw, p.d_fcpb, x, a.fch_gelu,
                                                p.fcpw, BT, 4 * Cl, C));
  KEEL_PROFILED("gelu", k::GeluBackward(dfch, a.fch, dfch_gelu, size_t(BT) * 4 * Cl));
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln2));
  KEEL_PROFILED("matmul_bwd",
                k::MatmulBackward(dtmp, p.d_fcw, p.d_fcb, dfch, x, p.fcw, BT, C, 4 * Cl));
  KEEL_PROFILED("tp_comm", m.SumRows(dtmp, dtmp));
  KEEL_PROFILED("layernorm", k::LayerNormBackward(dres, p.d_ln2w, p.d_ln2b, dtmp, a.res2, p.ln2w,
                                                  a.ln2_mean, a.ln2_rstd, m.R, C));
  KEEL_PROFILED("tp_comm", x = m.Whole(dres));
  KEEL_PROFILED("matmul_bwd",
                k::MatmulBackward(dtmp, p.d_projw, p.d_projb, x, a.atty, p.projw, BT, Cl, C));
  KEEL_PROFILED("attention_bwd",
                k::AttentionBackward(dqkv, dtmp, a.qkv, a.atty, a.lse, m.B, m.T, Cl, m.NHl));
  KEEL_PROFILED("tp_comm", x = m.Whole(a.ln1));
  KEEL_PROFILED("matmul_bwd",
                k::MatmulBackward(dtmp, p.d_qkvw, p.d_qkvb, dqkv, x, p.qkvw, BT, C, 3 * Cl));
  KEEL_PROFILED("tp_comm", m.SumRows(dtmp, dtmp));
  KEEL_PROFILED("layernorm", k::LayerNormBackward(dres, p.d_ln1w, p.d_ln1b, dtmp, a.in, p.ln1w,
                                                  a.ln1_mean, a.ln1_rstd, m.R, C));
}

// The final LayerNorm's weight and bias (working dtype) inside its segment's weights.
template <typename T>
std::pair<const T*, const T*> FinalNorm(GptModel::Impl& m) {
  const int s = m.layout.final_segment();
  const size_t base = m.layout.segment_start(s);
  const T* w = static_cast<const T*>(m.acc->Weights(s));
  return {w + (m.layout.Find("ln_f.weight").offset - base),
          w + (m.layout.Find("ln_f.bias").offset - base)};
}

// The embeddings' segment starts the layout of the stages that have one: offsets index it.
template <typename T>
const T* Wte(GptModel::Impl& m) {
  return static_cast<const T*>(m.acc->Weights(m.layout.embed_segment())) +
         m.layout.Find("wte.weight").offset;
}

// The embedding (first stage), the stage's blocks, and the final LayerNorm into "lnf" (last).
template <typename T>
void StageForward(GptModel::Impl& m, int slot, const int32_t* tokens) {
  const int C = m.cfg.n_embd;
  ParamAccess& acc = *m.acc;
  if (m.stage.first()) {
    acc.Use(0, Pass::kForward);
    const T* e = static_cast<const T*>(acc.Weights(0));
    // Vocabulary-parallel: each rank looks up the tokens it holds, the lead adds the positions.
    T* emb = m.sp ? m.Act<T>("gathered") : m.Resid<T>(slot, 0);
    KEEL_PROFILED("encoder",
                  k::EncoderForward(emb, tokens, e + m.layout.Find("wte.weight").offset,
                                    m.lead ? e + m.layout.Find("wpe.weight").offset : nullptr, m.B,
                                    m.T, C, m.v0, m.v0 + m.Vl));
    KEEL_PROFILED("tp_comm", m.SumRows(emb, m.Resid<T>(slot, 0)));
  }
  for (int l = m.stage.l0; l < m.stage.l1; ++l) {
    const int s = m.layout.block_segment(l);
    acc.Use(s, Pass::kForward);
    BlockForward(m, Block<T>(m, l, false), Acts<T>(m, l, slot));
    acc.Done(s, Pass::kForward);
  }
  if (!m.stage.last()) return;
  const int f = m.layout.final_segment(), e = m.layout.embed_segment();
  acc.Use(f, Pass::kForward);
  if (!m.stage.first()) acc.Use(e, Pass::kForward);  // the tied wte, for the classifier
  auto [lnfw, lnfb] = FinalNorm<T>(m);
  KEEL_PROFILED(
      "layernorm",
      k::LayerNormForward(m.Act<T>("lnf"), m.Act<float>("lnf_mean"), m.Act<float>("lnf_rstd"),
                          m.Resid<T>(slot, m.stage.layers()), lnfw, lnfb, m.R, C));
}

// The end of a forward-only pass: the embeddings and final LayerNorm are no longer needed.
void EndForward(GptModel::Impl& m) {
  if (m.stage.last()) m.acc->Done(m.layout.final_segment(), Pass::kForward);
  if (m.uses_embed) m.acc->Done(m.layout.embed_segment(), Pass::kForward);
}

double SumLosses(const float* losses, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += losses[i];
  return s;
}

template <typename T>
double StageLoss(GptModel::Impl& m, const int32_t* targets) {
  const int BT = m.B * m.T, C = m.cfg.n_embd;
  float* losses = m.Act<float>("losses");
  const k::VocabShard vs = m.vocab_shard();
  const T* x = nullptr;
  KEEL_PROFILED("tp_comm", x = m.Whole(m.Act<T>("lnf")));
  KEEL_PROFILED("classifier", k::ClassifierForward(losses, x, Wte<T>(m), targets, BT, C,
                                                   m.cfg.vocab_size, m.Vl, m.vocab(vs)));
  EndForward(m);
  return SumLosses(losses, BT);
}

template <typename T>
void ForwardLogits(GptModel::Impl& m, const int32_t* tokens, float* logits) {
  KEEL_CHECK(m.tp == 1, "ForwardLogits: the whole logits exist only without tensor parallelism");
  StageForward<T>(m, 0, tokens);
  KEEL_PROFILED("classifier", k::ClassifierLogits(logits, m.Act<T>("lnf"), Wte<T>(m), m.B * m.T,
                                                  m.cfg.n_embd, m.cfg.vocab_size));
  EndForward(m);
}

template <typename T>
double StageBackward(GptModel::Impl& m, int slot, const int32_t* tokens, const int32_t* targets,
                     float dloss, const void* dout, void* din) {
  const int BT = m.B * m.T, C = m.cfg.n_embd;
  ParamAccess& acc = *m.acc;
  const int e = m.layout.embed_segment();
  float* ge = m.uses_embed ? acc.Grads(e) : nullptr;  // the embeddings' segment starts the layout
  const size_t wte = m.uses_embed ? m.layout.Find("wte.weight").offset : 0;
  T* dres = m.Act<T>("dres");
  T* dtmp = m.Act<T>("dtmp");
  double loss = 0;
  if (m.stage.last()) {
    float* losses = m.Act<float>("losses");
    const k::VocabShard vs = m.vocab_shard();
    const T* x = nullptr;
    KEEL_PROFILED("tp_comm", x = m.Whole(m.Act<T>("lnf")));
    KEEL_PROFILED("classifier",
                  k::ClassifierForwardBackward(losses, dtmp, ge + wte, x, Wte<T>(m), targets, dloss,
                                               BT, C, m.cfg.vocab_size, m.Vl, m.vocab(vs)));
    KEEL_PROFILED("tp_comm", m.SumRows(dtmp, dtmp));  // the vocabulary shards' terms
    loss = SumLosses(losses, BT);
    std::memset(dres, 0, sizeof(T) * m.R * C);
    const int s = m.layout.final_segment();
    const size_t base = m.layout.segment_start(s);
    float* gf = acc.Grads(s);
    auto [lnfw, lnfb] = FinalNorm<T>(m);
    (void)lnfb;
    KEEL_PROFILED("layernorm",
                  k::LayerNormBackward(dres, gf + (m.layout.Find("ln_f.weight").offset - base),
                                       gf + (m.layout.Find("ln_f.bias").offset - base), dtmp,
                                       m.Resid<T>(slot, m.stage.layers()), lnfw,
                                       m.Act<float>("lnf_mean"), m.Act<float>("lnf_rstd"), m.R, C));
    acc.GradsDone(s);
    acc.Done(s, Pass::kBackward);
  } else {
    std::memcpy(dres, dout, sizeof(T) * m.R * C);
  }
  for (int l = m.stage.l1 - 1; l >= m.stage.l0; --l) {
    const int s = m.layout.block_segment(l);
    acc.Use(s, Pass::kBackward);
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
    KEEL_PROFILED("encoder", k::EncoderBackward(ge + wte, ge + m.layout.Find("wpe.weight").offset,
                                                x, tokens, m.B, m.T, C, m.v0, m.v0 + m.Vl));
  } else {
    std::memcpy(din, dres, sizeof(T) * m.R * C);
  }
  if (m.finishes_embed) {
    acc.GradsDone(e);
    acc.Done(e, Pass::kBackward);
  }
  return loss;
}

template <typename T>
double ForwardBackward(GptModel::Impl& m, const int32_t* tokens, const int32_t* targets,
                       float dloss) {
  StageForward<T>(m, 0, tokens);
  return StageBackward<T>(m, 0, tokens, targets, dloss, nullptr, nullptr);
}

}  // namespace

GptModel::GptModel(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
                   ParamAccess* params)
    : GptModel(cfg, dtype, B, T, recompute, params, WholeModel(cfg), 1) {}

GptModel::GptModel(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
                   ParamAccess* params, const StageRange& stage, int slots)
    : GptModel(cfg, dtype, B, T, recompute, params, ParamLayout::Gpt2Stage(cfg, stage), stage,
               slots) {}

GptModel::GptModel(const ModelConfig& cfg, DType dtype, int B, int T, Recompute recompute,
                   ParamAccess* params, const ParamLayout& layout, const StageRange& stage,
                   int slots, const TensorParallel& tp) {
  Validate(cfg);
  if (T > cfg.block_size)
    ThrowBadInput("[data] seq_len: " + std::to_string(T) + " is longer than the model's context " +
                  "(block_size " + std::to_string(cfg.block_size) + ")");
  impl_ = std::make_unique<Impl>(cfg, dtype, B, T, recompute, layout, stage, slots, tp);
  if (params == nullptr) {
    impl_->dense = std::make_unique<DenseParams>(impl_->layout, dtype);
    params = impl_->dense.get();
  }
  impl_->acc = params;
}
GptModel::~GptModel() = default;

const ModelConfig& GptModel::config() const { return impl_->cfg; }
const ParamLayout& GptModel::layout() const { return impl_->layout; }
const ActivationPlan& GptModel::activation_plan() const { return impl_->plan; }
DType GptModel::dtype() const { return impl_->dtype; }
int GptModel::batch() const { return impl_->B; }
int GptModel::seq_len() const { return impl_->T; }
int GptModel::slots() const { return impl_->slots; }
double GptModel::tp_wait_ms() const { return impl_->tp_ms; }
double GptModel::tp_bytes() const { return impl_->tp_bytes; }
void GptModel::ResetTpStats() { impl_->tp_ms = impl_->tp_bytes = 0; }

DenseParams& GptModel::Dense() const {
  KEEL_CHECK(impl_->dense != nullptr, "GptModel: parameters are held by its ParamAccess");
  return *impl_->dense;
}
float* GptModel::master() { return Dense().master.as<float>(); }
float* GptModel::grads() { return Dense().grads.as<float>(); }
bf16* GptModel::working_bf16() { return Dense().working.as<bf16>(); }
void GptModel::ZeroGrads() { std::memset(grads(), 0, Dense().grads.bytes()); }
void GptModel::SyncWorking() { Dense().SyncWorking(); }

double GptModel::ForwardBackward(const int32_t* tokens, const int32_t* targets, float dloss) {
  return impl_->dtype == DType::kF32 ? model::ForwardBackward<float>(*impl_, tokens, targets, dloss)
                                     : model::ForwardBackward<bf16>(*impl_, tokens, targets, dloss);
}

double GptModel::Forward(const int32_t* tokens, const int32_t* targets) {
  StageForward(0, tokens);
  return StageLoss(targets);
}

size_t GptModel::boundary_elems() const { return size_t(impl_->R) * impl_->cfg.n_embd; }
void* GptModel::StageInput(int slot) { return impl_->Resid<char>(slot, 0); }
const void* GptModel::StageOutput(int slot) {
  return impl_->Resid<char>(slot, impl_->stage.layers());
}

void* GptModel::PipeGradIn(int slot) { return impl_->Act<char>("pipe_grad_in", 0, slot); }
void* GptModel::PipeGradOut(int slot) { return impl_->Act<char>("pipe_grad_out", 0, slot); }

void GptModel::StageForward(int slot, const int32_t* tokens) {
  if (impl_->dtype == DType::kF32)
    model::StageForward<float>(*impl_, slot, tokens);
  else
    model::StageForward<bf16>(*impl_, slot, tokens);
}

double GptModel::StageBackward(int slot, const int32_t* tokens, const int32_t* targets, float dloss,
                               const void* dout, void* din) {
  return impl_->dtype == DType::kF32
             ? model::StageBackward<float>(*impl_, slot, tokens, targets, dloss, dout, din)
             : model::StageBackward<bf16>(*impl_, slot, tokens, targets, dloss, dout, din);
}

double GptModel::StageLoss(const int32_t* targets) {
  return impl_->dtype == DType::kF32 ? model::StageLoss<float>(*impl_, targets)
                                     : model::StageLoss<bf16>(*impl_, targets);
}

void GptModel::ForwardLogits(const int32_t* tokens, float* logits) {
  if (impl_->dtype == DType::kF32)
    model::ForwardLogits<float>(*impl_, tokens, logits);
  else
    model::ForwardLogits<bf16>(*impl_, tokens, logits);
}

}  // namespace keel::model

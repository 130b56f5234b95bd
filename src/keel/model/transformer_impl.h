// The inside of a Transformer, shared by the model's families (transformer.cc: the stage pieces and
// GPT-2's blocks; llama_block.cc: Llama's blocks): the parameters a model owns, the activation
// arena, and the tensor-parallel collectives. Internal to model/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "keel/core/error.h"
#include "keel/core/memory.h"
#include "keel/kernels/backend.h"
#include "keel/kernels/profile.h"
#include "keel/model/context_parallel.h"
#include "keel/model/fp8_state.h"
#include "keel/model/quantize.h"
#include "keel/model/transformer.h"
#include "keel/model/working_copy.h"
#include "keel/parallel/comm_wait.h"
#include "keel/parallel/zigzag.h"

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
// `master` holds every value in fp32; SyncWorking makes the working copy (bf16 runs, a quantized
// base: working_copy.h) from it.
class DenseParams final : public ParamAccess {
 public:
  DenseParams(const ParamLayout& layout, DType dtype, const kernels::Backend& be)
      : layout_(layout),
        dtype_(dtype),
        be_(be),
        separate_(dtype != DType::kF32 || layout.base_quant() != BaseQuant::kNone),
        master(Buffer::Zeroed(be, layout.total() * 4)),
        grads(Buffer::Zeroed(be, layout.grad_total() * 4)),
        working(Buffer::Zeroed(be, separate_ ? layout.work_total() * DTypeSize(dtype) : 0)),
        biases(Buffer::Zeroed(be, dtype != DType::kF32 ? layout.n_bias() * 4 : 0)),
        codes(Buffer::Zeroed(be, layout.quant_code_bytes())),
        scales(Buffer::Zeroed(be, layout.quant_scales() * 4)) {}

  const void* Weights(int s) override {
    if (!separate_) return master.as<float>() + layout_.segment_start(s);
    return working.as<char>() + layout_.segment_work_start(s) * DTypeSize(dtype_);
  }
  QuantizedWeights Quantized(int s) override {
    return {codes.as<uint8_t>() + CodeByte(layout_.base_quant(), layout_.segment_quant_start(s)),
            scales.as<float>() + layout_.segment_scale_start(s)};
  }
  const float* Biases() override { return biases.as<float>(); }
  float* Grads(int s) override { return grads.as<float>() + layout_.segment_grad_start(s); }

  void SyncWorking() {
    if (!separate_) return;
    if (layout_.base_quant() == BaseQuant::kNone) {
      be_.Narrow(dtype_, working.data(), master.as<float>(), layout_.total());
    } else if (be_.host_visible()) {
      WriteWorking(layout_, dtype_, master.as<float>(), working.data(), codes.as<uint8_t>(),
                   scales.as<float>());
    } else {
      // Quantization runs on the host (quantize.h): staged where the backend's memory is not.
      std::vector<float> values(layout_.total());
      std::vector<char> w(working.bytes());
      std::vector<uint8_t> c(codes.bytes());
      std::vector<float> sc(layout_.quant_scales());
      be_.ToHost(values.data(), master.data(), 4 * values.size());
      WriteWorking(layout_, dtype_, values.data(), w.data(), c.data(), sc.data());
      be_.FromHost(working.data(), w.data(), w.size());
      be_.FromHost(codes.data(), c.data(), c.size());
      be_.FromHost(scales.data(), sc.data(), 4 * sc.size());
    }
    if (dtype_ == DType::kF32) return;
    for (const ParamInfo& p : layout_.params())
      if (p.bias_index != SIZE_MAX)
        be_.Copy(biases.as<float>() + p.bias_index, master.as<float>() + p.offset, p.numel * 4);
  }

 private:
  const ParamLayout& layout_;
  DType dtype_;
  const kernels::Backend& be_;
  bool separate_;  // the working copy is not the master itself

 public:
  Buffer master, grads, working, biases, codes, scales;
};

// A matrix product's weight as Impl::Matrix finds it: resident in the working copy (w), or the
// first of the quantized tensors (q) it spans, n elements; Impl::Mat gives the elements.
template <typename T>
struct MatW {
  const T* w = nullptr;
  const ParamInfo* q = nullptr;
  size_t n = 0;
  int seg = -1;  // q's segment (ParamAccess::Quantized)
};

struct Transformer::Impl {
  const kernels::Backend* be;
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
  Buffer tokens, targets;  // uploaded ids where the backend's memory is not the host's
  std::vector<float> host_losses;
  std::unique_ptr<DenseParams> dense;  // when the model owns its parameters
  ParamAccess* acc = nullptr;
  // Tensor parallelism: tp ranks, this one's shard, its heads and channels, its vocabulary rows.
  LayerGroups tpg;
  // This rank's query heads and their channels, key/value heads, fused q, k, v columns, MLP hidden
  // units, vocabulary rows and the first of them.
  int tp, tp_rank, NHl, Cl, NKVl, QKVl, Fl, Vl, v0;
  bool lead;  // tp rank 0: adds the replicated biases (and without sp the residual) into sums
  bool sp;    // sequence parallelism: R of the B·T rows from row0
  int R, row0;
  // Context parallelism: cp ranks hold two chunks each of every sequence (parallel/zigzag.h).
  int cp, cp_rank;
  CpStats cp_stats;
  double tp_ms = 0, tp_bytes = 0;
  double head_ms = 0;  // the fused classifier and loss in backward, its tp waits excluded
  // Document masking (Transformer::SetDocumentMask): rows split after each doc_eos token; the
  // current micro-batch's document start per position, for the attention kernels (null: off).
  int doc_eos = -1;
  std::vector<int32_t> doc_start_buf;
  const int32_t* doc_start = nullptr;
  // Frozen parameters (Transformer::SetFrozen), by ParamInfo::stream: their matrix products'
  // weight gradients are not computed.
  std::vector<bool> frozen;
  internal::Fp8State fp8;  // fp8 block products (ModelConfig::fp8, fp8_products.h)
  // LoRA dropout (Transformer::SetDropout): each slot's, and the pass now running's (`on` false:
  // none, as in evaluation).
  struct Dropout {
    bool on = false;
    uint64_t key = 0, row0 = 0;
  };
  std::vector<Dropout> slot_dropout = std::vector<Dropout>(size_t(slots));
  Dropout dropout;
  int slot = 0;  // the micro-batch slot of the pass now running (DoRA's kept buffers)

  Impl(const kernels::Backend& backend, const ModelConfig& c, DType d, int b, int t, Recompute r,
       const ParamLayout& lay, const StageRange& st, int sl, const LayerGroups& tpar)
      : be(&backend),
        cfg(c),
        dtype(d),
        B(b),
        T(t),
        recompute(r),
        stage(st),
        slots(sl),
        layout(lay),
        uses_embed(st.first() || (st.last() && c.tied())),
        // The rank's lowest chunk runs its last backward: the embeddings' gradients (the
        // classifier's too, on the last rank) are final only then.
        finishes_embed(lay.embed_segment() >= 0 && st.l0 == lay.chunks().front().l0),
        plan(PlanActivations(c, b, t, d, r, &st, sl, lay.tp().size,
                             tpar.sequence && lay.tp().size > 1, tpar.cp ? tpar.cp->size() : 1,
                             tpar.cp_comm)),
        arena(Buffer::Zeroed(backend, plan.total_bytes)),
        tokens(backend, backend.host_visible() ? 0 : 4 * size_t(b) * t),
        targets(backend, backend.host_visible() ? 0 : 4 * size_t(b) * t),
        tpg(tpar),
        tp(lay.tp().size),
        tp_rank(lay.tp().rank),
        NHl(c.n_head / tp),
        Cl(c.n_embd / tp),
        NKVl(c.kv_heads() / tp),
        QKVl(c.qkv_dim() / tp),
        Fl(c.ffn() / tp),
        Vl(c.padded_vocab() / tp),
        v0(tp_rank * Vl),
        lead(tp_rank == 0),
        sp(tpar.sequence && tp > 1),
        R(sp ? b * t / tp : b * t),
        row0(sp ? tp_rank * R : 0),
        cp(tpar.cp ? tpar.cp->size() : 1),
        cp_rank(tpar.cp ? tpar.cp->rank() : 0) {
    KEEL_CHECK(cp == 1 || t % 2 == 0, "Transformer: context parallelism holds two chunks per row");
    KEEL_CHECK(!sp || (b * t) % tp == 0, "Transformer: sequence parallelism needs tp | B·T");
    KEEL_CHECK(c.lora_base == BaseQuant::kNone || c.lora_base == lay.base_quant(),
               "Transformer: the layout's quantized base is not the config's");
    KEEL_CHECK(tp == 1 || backend.host_visible(),
               "Transformer: tensor parallelism runs on the CPU backend only so far");
    KEEL_CHECK(tp == 1 || (tpg.tp && tpg.tp->size() == tp && tpg.tp->rank() == tp_rank),
               "Transformer: the tensor-parallel group does not match the layout's shard");
  }

  // Completes a partial sum over the tp ranks, in place (`n` elements of type `t`: by default the
  // model's dtype).
  void TpSum(void* data, size_t n, std::optional<DType> t = std::nullopt) {
    if (tp == 1) return;
    const DType d = t.value_or(dtype);
    auto w = tpg.tp->AllReduceSumAsync(data, n, d);
    tp_ms += parallel::WaitOrLost(*w, tpg.timeout_s, "a tensor-parallel all-reduce");
    tp_bytes += double(n * DTypeSize(d));
  }

  // Sequence parallelism: every rank's R rows of `mine` → all B·T rows in `all`, in rank order.
  void GatherRows(const void* mine, void* all) {
    const size_t n = size_t(R) * cfg.n_embd;
    auto w = tpg.tp->AllGatherAsync(mine, all, std::vector<size_t>(size_t(tp), n), dtype);
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
    auto w = tpg.tp->ReduceScatterSumAsync(all, mine, std::vector<size_t>(size_t(tp), n), dtype);
    tp_ms += parallel::WaitOrLost(*w, tpg.timeout_s, "a sequence-parallel reduce-scatter");
    tp_bytes += double(n * size_t(tp) * DTypeSize(dtype));
  }

  // The vocabulary shards' per-row statistics → the whole vocabulary's (kernels::VocabShard).
  void CombineVocabStats(float* lse, float* target_logit, int rows) {
    float* mine = Act<float>("vocab_stats");
    float* all = mine + 2 * size_t(rows);
    be->Copy(mine, lse, 4 * size_t(rows));
    be->Copy(mine + rows, target_logit, 4 * size_t(rows));
    auto w = tpg.tp->AllGatherAsync(mine, all, 2 * size_t(rows));
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

  // Attention over this rank's heads: causal over the micro-batch's rows, or under context
  // parallelism over the whole sequences whose chunks they are (context_parallel.h).
  template <typename U>
  CpBuffers<U> CpBufs() const {
    auto find = [&](const char* name) -> char* {
      for (const ActivationBuffer& b : plan.buffers)
        if (b.name == name) return arena.as<char>() + b.offset;
      return nullptr;  // not this variant's
    };
    return CpBuffersAt<U>(find, size_t(B) * T * size_t(QKVl - Cl));
  }
  template <typename U>
  void Attend(U* out, float* lse, const U* qkv) {
    if (cp == 1) return be->AttentionForward(out, lse, qkv, B, T, Cl, NHl, NKVl, doc_start);
    CpAttentionForward(*be, *tpg.cp, tpg.cp_comm, tpg.timeout_s, {B, T, Cl, NHl, NKVl, doc_start},
                       CpBufs<U>(), out, lse, qkv, &cp_stats);
  }
  template <typename U>
  void AttendBackward(U* dqkv, const U* dout, const U* qkv, const U* out, const float* lse) {
    if (cp == 1)
      return be->AttentionBackward(dqkv, dout, qkv, out, lse, B, T, Cl, NHl, NKVl, doc_start);
    CpAttentionBackward(*be, *tpg.cp, tpg.cp_comm, tpg.timeout_s, {B, T, Cl, NHl, NKVl, doc_start},
                        CpBufs<U>(), dqkv, dout, qkv, out, lse, &cp_stats);
  }
  // `fn(row, n, pos0)` for each run of a micro-batch's rows whose positions are consecutive: the
  // B rows whole (positions from 0), or under context parallelism each row's two chunks.
  template <typename Fn>
  void ForPositions(Fn&& fn) const {
    if (cp == 1) return fn(0, B, T, 0);
    const int L = T / 2;
    for (int b = 0; b < B; ++b)
      for (int c = 0; c < 2; ++c)
        fn(size_t(b) * T + size_t(c) * L, 1, L, parallel::ZigzagPosition(cp, cp_rank, T, c * L));
  }
  // Llama's rotary positions of qkv's q and k heads, in place (or their backward).
  template <typename U>
  void Rope(U* qkv, bool backward) const {
    const int hs = Cl / NHl;
    ForPositions([&](size_t row, int b, int t, int pos0) {
      U* x = qkv + row * size_t(QKVl);
      if (backward)
        be->RopeBackward(x, b, t, NHl, NKVl, hs, cfg.rope_theta, pos0);
      else
        be->RopeForward(x, b, t, NHl, NKVl, hs, cfg.rope_theta, pos0);
    });
  }

  // A matrix product's weight (fused products: `n` elements of adjacent tensors from `p` on) in
  // segment s, whose working weights start at `w`: there, or where Mat will dequantize it.
  template <typename U>
  MatW<U> Matrix(const U* w, int s, const ParamInfo& p, size_t n) const {
    if (!p.quantized()) return {w + (p.work_offset - layout.segment_work_start(s)), nullptr, n};
    return {nullptr, &p, n, s};
  }
  // Its elements in the working dtype: the working copy's, or dequantized into the shared buffer
  // (valid until the next Mat).
  template <typename U>
  const U* Mat(const MatW<U>& mw) {
    if (mw.w) return mw.w;
    U* out = Act<U>("dequant");
    const BaseQuant q = layout.base_quant();
    const QuantizedWeights qw = acc->Quantized(mw.seg);
    const size_t code = CodeByte(q, mw.q->quant_offset) -
                        CodeByte(q, layout.segment_quant_start(mw.seg)),
                 scale = mw.q->scale_offset - layout.segment_scale_start(mw.seg);
    KEEL_PROFILED("dequant", be->Dequantize(out, qw.codes + code, qw.scales + scale, mw.n,
                                            QuantGroup(q, size_t(mw.q->shape[1])), FormatOf(q)));
    return out;
  }
  // Tensor `p` of segment s (not quantized) in the working dtype.
  template <typename U>
  const U* At(const U* w, int s, const ParamInfo& p) const {
    return w + (p.work_offset - layout.segment_work_start(s));
  }

  // Parameter p's gradient in segment s's gradients `g` (ParamAccess::Grads(s)), or null where
  // it has none (a LoRA layout's frozen weights: ParamLayout::grad_offset). Null `g`: no
  // gradients asked for.
  float* GradAt(float* g, const ParamInfo& p, int s) const {
    if (!g || p.grad_offset == SIZE_MAX) return nullptr;
    return g + (p.grad_offset - layout.segment_grad_start(s));
  }
  // Where a matrix product's weight gradient goes, or null for a frozen weight, whose product is
  // skipped.
  float* WeightGrad(float* g, const ParamInfo& p, int s) const {
    if (p.stream < frozen.size() && frozen[p.stream]) return nullptr;
    return GradAt(g, p, s);
  }

  // The micro-batch's document starts from its host token ids: position t's document begins
  // after the last doc_eos before t. Under context parallelism a row's document may begin in
  // another rank's chunks: the cp group's tokens are gathered (B·T ids each) and each row gets
  // the position, in its whole sequence, where its document begins.
  void NoteDocuments(const int32_t* host_tokens) {
    doc_start = nullptr;
    if (doc_eos < 0) return;
    KEEL_CHECK(host_tokens, "Transformer: document masking needs the micro-batch's tokens");
    doc_start_buf.resize(size_t(B) * T);
    const size_t n = size_t(B) * T;
    std::vector<int32_t> all(n * size_t(cp));
    if (cp > 1) {  // ids travel as 4-byte words: an all-gather moves them untouched
      auto w = tpg.cp->AllGatherAsync(reinterpret_cast<const float*>(host_tokens),
                                      reinterpret_cast<float*>(all.data()), n);
      cp_stats.wait_ms += parallel::WaitOrLost(*w, tpg.timeout_s, "the documents' token ids");
    }
    const int W = cp * T;  // positions per whole sequence
    std::vector<int32_t> whole(static_cast<size_t>(W)), starts(static_cast<size_t>(W));
    for (int b = 0; b < B; ++b) {
      for (int q = 0; q < cp; ++q)
        for (int t = 0; t < T; ++t)
          whole[size_t(parallel::ZigzagPosition(cp, q, T, t))] =
              cp > 1 ? all[size_t(q) * n + size_t(b) * T + size_t(t)]
                     : host_tokens[size_t(b) * T + size_t(t)];
      int32_t start = 0;
      for (int p = 0; p < W; ++p) {
        starts[size_t(p)] = start;
        if (whole[size_t(p)] == doc_eos) start = p + 1;
      }
      for (int t = 0; t < T; ++t)
        doc_start_buf[size_t(b) * T + size_t(t)] =
            starts[size_t(parallel::ZigzagPosition(cp, cp_rank, T, t))];
    }
    doc_start = doc_start_buf.data();
  }

  // Token ids (B·T, host memory; may be null) where the backend reads them: themselves when it
  // reads host memory, else uploaded into `buf`.
  const int32_t* Ids(const int32_t* host, Buffer& buf) const {
    if (!host || be->host_visible()) return host;
    be->FromHost(buf.data(), host, buf.bytes());
    return buf.as<int32_t>();
  }
  // Σ of n per-row losses (backend memory), in row order on the host.
  double SumLosses(const float* losses, int n) {
    const float* h = losses;
    if (!be->host_visible()) {
      host_losses.resize(size_t(n));
      be->ToHost(host_losses.data(), losses, 4 * size_t(n));
      h = host_losses.data();
    }
    double s = 0;
    for (int i = 0; i < n; ++i) s += h[i];
    return s;
  }
};

namespace internal {

// Llama's blocks (llama_block.cc). Forward: resid[l] → resid[l+1] of the micro-batch in `slot`;
// `attn_only` stops after the attention sublayer's inputs (recompute "attn"). Backward: dres
// holds ∂loss/∂resid[l+1] on entry and ∂loss/∂resid[l] on exit; it recomputes what the model's
// Recompute setting dropped.
template <typename T>
void LlamaBlockForward(Transformer::Impl& m, int l, int slot, bool attn_only = false);
template <typename T>
void LlamaBlockBackward(Transformer::Impl& m, int l, int slot, T* dres);

}  // namespace internal
}  // namespace keel::model

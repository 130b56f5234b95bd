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
#include <type_traits>
#include <utility>
#include <vector>

#include "keel/core/error.h"
#include "keel/core/memory.h"
#include "keel/kernels/backend.h"
#include "keel/kernels/profile.h"
#include "keel/model/quantize.h"
#include "keel/model/transformer.h"
#include "keel/model/working_copy.h"
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
// `master` holds every value in fp32; SyncWorking makes the working copy (bf16 runs, a quantized
// base: working_copy.h) from it.
class DenseParams final : public ParamAccess {
 public:
  DenseParams(const ParamLayout& layout, DType dtype, const kernels::Backend& be)
      : layout_(layout),
        dtype_(dtype),
        be_(be),
        separate_(dtype == DType::kBF16 || layout.base_quant() != BaseQuant::kNone),
        master(Buffer::Zeroed(be, layout.total() * 4)),
        grads(Buffer::Zeroed(be, layout.grad_total() * 4)),
        working(Buffer::Zeroed(be, separate_ ? layout.work_total() * DTypeSize(dtype) : 0)),
        biases(Buffer::Zeroed(be, dtype == DType::kBF16 ? layout.n_bias() * 4 : 0)),
        codes(Buffer::Zeroed(be, layout.quant_code_bytes())),
        scales(Buffer::Zeroed(be, layout.quant_scales() * 4)) {}

  const void* Weights(int s) override {
    if (!separate_) return master.as<float>() + layout_.segment_start(s);
    return working.as<char>() + layout_.segment_work_start(s) * DTypeSize(dtype_);
  }
  QuantizedWeights Quantized() override { return {codes.as<uint8_t>(), scales.as<float>()}; }
  const float* Biases() override { return biases.as<float>(); }
  float* Grads(int s) override { return grads.as<float>() + layout_.segment_grad_start(s); }

  void SyncWorking() {
    if (!separate_) return;
    if (layout_.base_quant() == BaseQuant::kNone) {
      be_.ToBf16(working.as<bf16>(), master.as<float>(), layout_.total());
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
    if (dtype_ != DType::kBF16) return;
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
  TensorParallel tpg;
  // This rank's query heads and their channels, key/value heads, fused q, k, v columns, MLP hidden
  // units, vocabulary rows and the first of them.
  int tp, tp_rank, NHl, Cl, NKVl, QKVl, Fl, Vl, v0;
  bool lead;  // tp rank 0: adds the replicated biases (and without sp the residual) into sums
  bool sp;    // sequence parallelism: R of the B·T rows from row0
  int R, row0;
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
       const ParamLayout& lay, const StageRange& st, int sl, const TensorParallel& tpar)
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
                             tpar.sequence && lay.tp().size > 1)),
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
        row0(sp ? tp_rank * R : 0) {
    KEEL_CHECK(!sp || (b * t) % tp == 0, "Transformer: sequence parallelism needs tp | B·T");
    KEEL_CHECK(c.lora_base == BaseQuant::kNone || c.lora_base == lay.base_quant(),
               "Transformer: the layout's quantized base is not the config's");
    KEEL_CHECK(tp == 1 || backend.host_visible(),
               "Transformer: tensor parallelism runs on the CPU backend only so far");
    KEEL_CHECK(tp == 1 || (tpg.comm && tpg.comm->size() == tp && tpg.comm->rank() == tp_rank),
               "Transformer: the tensor-parallel group does not match the layout's shard");
  }

  // Completes a partial sum over the tp ranks, in place (`n` elements of type `t`: by default the
  // model's dtype).
  void TpSum(void* data, size_t n, std::optional<DType> t = std::nullopt) {
    if (tp == 1) return;
    const DType d = t.value_or(dtype);
    auto w = tpg.comm->AllReduceSumAsync(data, n, d);
    tp_ms += parallel::WaitOrLost(*w, tpg.timeout_s, "a tensor-parallel all-reduce");
    tp_bytes += double(n * DTypeSize(d));
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
    be->Copy(mine, lse, 4 * size_t(rows));
    be->Copy(mine + rows, target_logit, 4 * size_t(rows));
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

  // A matrix product's weight (fused products: `n` elements of adjacent tensors from `p` on) in
  // segment s, whose working weights start at `w`: there, or where Mat will dequantize it.
  template <typename U>
  MatW<U> Matrix(const U* w, int s, const ParamInfo& p, size_t n) const {
    if (!p.quantized()) return {w + (p.work_offset - layout.segment_work_start(s)), nullptr, n};
    return {nullptr, &p, n};
  }
  // Its elements in the working dtype: the working copy's, or dequantized into the shared buffer
  // (valid until the next Mat).
  template <typename U>
  const U* Mat(const MatW<U>& mw) {
    if (mw.w) return mw.w;
    U* out = Act<U>("dequant");
    const BaseQuant q = layout.base_quant();
    const QuantizedWeights qw = acc->Quantized();
    KEEL_PROFILED("dequant", be->Dequantize(out, qw.codes + CodeByte(q, mw.q->quant_offset),
                                            qw.scales + mw.q->scale_offset, mw.n,
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
  // after the last doc_eos before t.
  void NoteDocuments(const int32_t* host_tokens) {
    doc_start = nullptr;
    if (doc_eos < 0) return;
    KEEL_CHECK(host_tokens, "Transformer: document masking needs the micro-batch's tokens");
    doc_start_buf.resize(size_t(B) * T);
    for (int b = 0; b < B; ++b) {
      int32_t start = 0;
      for (int t = 0; t < T; ++t) {
        const size_t i = size_t(b) * T + size_t(t);
        doc_start_buf[i] = start;
        if (host_tokens[i] == doc_eos) start = t + 1;
      }
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

// A LoRA adapter of one block product (config.h): A (r, in), B (out, r) in the working dtype,
// their gradients; all null when the product has none. `tag` names the product for its dropout
// mask (layer and target), `col0` is the first of the whole input's columns this rank's A reads
// (a row-parallel product's shard).
template <typename T>
struct LoraPair {
  const T *A = nullptr, *B = nullptr;
  float *dA = nullptr, *dB = nullptr;
  int in = 0, out = 0;
  uint64_t tag = 0;
  uint32_t col0 = 0;
  // DoRA: the magnitude (fp32) and its gradient; null without. `k`: the target's index in
  // kLoraTargets (its buffers, kDoraZ).
  const float* mag = nullptr;
  float* dmag = nullptr;
  int k = 0;
  int layer = 0;              // the block's (global) index
  bool row_parallel = false;  // the block's output projections (attention's and the MLP's)
};

// Block l's adapter of target `t`, in segment s whose weights start at `w` (gradients at `g`, may
// be null).
template <typename T>
LoraPair<T> Lora(const Transformer::Impl& m, int l, LoraTarget t, const T* w, float* g, int s) {
  LoraPair<T> a;
  if (m.cfg.lora_rank == 0 || !(m.cfg.lora_targets & t)) return a;
  const std::string mod = "h." + std::to_string(l) + "." + LoraModule(m.cfg.llama(), t);
  const ParamInfo& A = m.layout.Find(mod + ".lora_A.weight");
  const ParamInfo& B = m.layout.Find(mod + ".lora_B.weight");
  a.A = m.At(w, s, A), a.B = m.At(w, s, B);
  a.dA = m.WeightGrad(g, A, s), a.dB = m.WeightGrad(g, B, s);
  a.in = A.shape[1], a.out = B.shape[0];  // this rank's shard's (ParamLayout::Stage's TpCut)
  a.tag = uint64_t(l) * 16 + t;
  a.col0 = A.tp_axis == 1 ? uint32_t(m.tp_rank * a.in) : 0;
  while (kLoraTargets[a.k] != t) ++a.k;
  a.row_parallel = t == kLoraProj || t == kLoraFcProj;
  a.layer = l;
  if (m.cfg.lora_dora) {
    const ParamInfo& M = m.layout.Find(mod + ".lora_magnitude_vector");
    // fp32 in every precision: bf16 runs read it from the fp32 copy biases have.
    if constexpr (std::is_same_v<T, float>)
      a.mag = m.At(w, s, M);
    else
      a.mag = m.acc->Biases() + M.bias_index;
    a.dmag = m.WeightGrad(g, M, s);
  }
  return a;
}

// The dropout mask of adapter `a` in the pass now running: the slot's key mixed with the
// product's tag, so that every layer and product draws its own.
template <typename T>
kernels::DropoutMask LoraMask(const Transformer::Impl& m, const LoraPair<T>& a) {
  const double p = m.cfg.lora_dropout;
  return {kernels::SplitMix64(m.dropout.key ^ ((a.tag + 1) * 0x9E3779B97F4A7C15ull)),
          m.dropout.row0, a.col0, uint32_t(std::min(4294967295.0, std::ldexp(p, 32))),
          float(1.0 / (1.0 - p))};
}

// The adapter's input: x, or under dropout x masked into the shared "lora_x".
template <typename T>
const T* LoraInput(Transformer::Impl& m, const T* x, const LoraPair<T>& a) {
  if (!m.dropout.on || m.cfg.lora_dropout <= 0) return x;
  T* xd = m.Act<T>("lora_x");
  KEEL_PROFILED("lora", m.be->Dropout(xd, x, m.B * m.T, a.in, LoraMask(m, a), false));
  return xd;
}

// out (B·T, a.out) += s·(xin·Aᵀ)·Bᵀ for the adapter's input xin (LoraInput's).
template <typename T>
void LoraProducts(Transformer::Impl& m, T* out, const T* xin, const LoraPair<T>& a) {
  const int BT = m.B * m.T, r = m.cfg.lora_rank;
  T* h = m.Act<T>("lora_h");
  KEEL_PROFILED("lora", m.be->MatmulForward(h, xin, a.A, nullptr, BT, a.in, r));
  KEEL_PROFILED("lora", m.be->MatmulForward(out, h, a.B, nullptr, BT, r, a.out,
                                            /*accumulate=*/true, m.cfg.lora_scale()));
}

// out (B·T, a.out) += s·(x·Aᵀ)·Bᵀ (x masked under dropout), after the product it adapts.
template <typename T>
void LoraForward(Transformer::Impl& m, T* out, const T* x, const LoraPair<T>& a) {
  if (a.A) LoraProducts(m, out, LoraInput(m, x, a), a);
}

// DoRA under dropout in this pass, PEFT's form: the masked input x̃ = D(x) feeds z (the base
// product too), and the output adds the base product of the rest: y = x·Wᵀ + b + (g − 1) ⊙ x̃·Wᵀ
// + g ⊙ s·(x̃·Aᵀ)·Bᵀ = (x − x̃)·Wᵀ + b + g ⊙ z. Without dropout (evaluation too) x̃ = x.
template <typename T>
bool DoraMasked(const Transformer::Impl& m, const LoraPair<T>& a) {
  return a.mag && m.dropout.on && m.cfg.lora_dropout > 0;
}

// The mask of LoraMask with its scale negated: accumulated, it subtracts D(x).
template <typename T>
kernels::DropoutMask MinusMask(const Transformer::Impl& m, const LoraPair<T>& a) {
  kernels::DropoutMask minus = LoraMask(m, a);
  minus.scale = -minus.scale;
  return minus;
}

// x − D(x) (B·T, a.in) into "lora_dx".
template <typename T>
const T* DoraRemainder(Transformer::Impl& m, const T* x, const LoraPair<T>& a) {
  const int BT = m.B * m.T;
  T* u = m.Act<T>("lora_dx");
  m.be->Copy(u, x, sizeof(T) * size_t(BT) * size_t(a.in));
  KEEL_PROFILED("lora", m.be->Dropout(u, x, BT, a.in, MinusMask(m, a), /*accumulate=*/true));
  return u;
}
// DoRA's kept buffers of adapter `a` in the pass now running: its product's z (B·T rows of a.out;
// a row-parallel product's under sequence parallelism this rank's R rows), and
// its row scales then inverse norms (2·a.out).
template <typename T>
std::pair<T*, float*> DoraBuffers(const Transformer::Impl& m, const LoraPair<T>& a) {
  const int i = a.layer - m.stage.l0;
  return {m.Act<T>(kDoraZ[a.k], i, m.slot), m.Act<float>(kDoraScale[a.k], i, m.slot)};
}

// DoRA's z = x·Wᵀ + s·(x·Aᵀ)·Bᵀ (B·T, N; K input columns) into its kept buffer, and the rows'
// scales and inverse norms (g = magnitude / ‖W + s·B·A‖). A row-parallel product's shard holds
// some of each row's columns: its z and squared norms are partial sums, completed over the tp
// group (under sequence parallelism z's sum is reduce-scattered: this rank's rows, at the start).
template <typename T>
std::pair<T*, float*> DoraZ(Transformer::Impl& m, const T* x, const T* weight, int K, int N,
                            const LoraPair<T>& a) {
  const int BT = m.B * m.T;
  auto [z, g] = DoraBuffers(m, a);
  const bool partial = a.row_parallel && m.tp > 1;
  // Under sequence parallelism a row-parallel z keeps this rank's rows only: the partial sums of
  // all rows go to the shared buffer first.
  T* sum = partial && m.sp ? m.Act<T>("gathered") : z;
  const T* xin = LoraInput(m, x, a);
  KEEL_PROFILED("matmul_fwd", m.be->MatmulForward(sum, xin, weight, nullptr, BT, K, N));
  LoraProducts(m, sum, xin, a);
  const int r = m.cfg.lora_rank;
  const float s = m.cfg.lora_scale();
  if (!partial) {
    KEEL_PROFILED("lora", m.be->DoraNorm(g, g + N, a.mag, weight, a.A, a.B, N, K, r, s));
    return {z, g};
  }
  KEEL_PROFILED("tp_comm", m.SumRows(sum, z));
  float* sq = g + N;
  KEEL_PROFILED("lora", m.be->DoraNorm(g, sq, nullptr, weight, a.A, a.B, N, K, r, s));
  KEEL_PROFILED("tp_comm", m.TpSum(sq, size_t(N), DType::kF32));
  for (int o = 0; o < N; ++o) {  // host memory: tensor parallelism runs on the CPU backend
    const float n = std::sqrt(sq[o]);
    sq[o] = n > 0 ? 1.0f / n : 0.0f;
    g[o] = a.mag[o] * sq[o];
  }
  return {z, g};
}

// out = x·weightᵀ + bias (B·T, N; K input columns) and the adapter's part, LoRA's or DoRA's
// (y = g ⊙ z + bias): a column-parallel product (a tp rank's: its output columns, whose norms it
// holds whole).
template <typename T>
void AdaptedForward(Transformer::Impl& m, T* out, const T* x, const T* weight, const float* bias,
                    int K, int N, const LoraPair<T>& a) {
  if (a.mag) {
    auto [z, g] = DoraZ(m, x, weight, K, N, a);
    const bool masked = DoraMasked(m, a);
    if (masked)
      KEEL_PROFILED("matmul_fwd", m.be->MatmulForward(out, DoraRemainder(m, x, a), weight, bias,
                                                      m.B * m.T, K, N));
    KEEL_PROFILED("lora",
                  m.be->DoraScale(out, z, g, masked ? nullptr : bias, m.B * m.T, N, masked));
    return;
  }
  KEEL_PROFILED("matmul_fwd", m.be->MatmulForward(out, x, weight, bias, m.B * m.T, K, N));
  LoraForward(m, out, x, a);
}

// DoRA's backward through y = g ⊙ z + bias, before the adapted product's own: the magnitude's
// gradient, and ∂loss/∂z = g ⊙ dout (the norm held constant), which the product and its adapter
// then take in dout's place. Without DoRA: dout. A row-parallel product's magnitude is whole on
// every tp rank and its gradient summed over the group (TrainStep::SumTpPartialGrads): each rank
// adds its own rows' share under sequence parallelism (dout is gathered in rank order; z holds
// the rank's rows), the lead all of it otherwise.
template <typename T>
const T* DoraBackward(Transformer::Impl& m, const T* dout, const LoraPair<T>& a) {
  if (!a.mag) return dout;
  const int BT = m.B * m.T;
  auto [z, g] = DoraBuffers(m, a);
  if (a.dmag && (!a.row_parallel || m.tp == 1 || m.lead || m.sp)) {
    const bool own_rows = a.row_parallel && m.sp;
    const T* dy = own_rows ? dout + size_t(m.row0) * size_t(a.out) : dout;
    KEEL_PROFILED("lora",
                  m.be->DoraMagnitudeGrad(a.dmag, dy, z, g + a.out, own_rows ? m.R : BT, a.out));
  }
  T* dz = m.Act<T>("dora_dz");
  KEEL_PROFILED("lora", m.be->DoraScale(dz, dout, g, nullptr, BT, a.out, false));
  return dz;
}

// out = residual + inp·weightᵀ + bias (+ the adapter's product) over the tp ranks: the lead rank
// seeds the residual and the bias, the others zero, and the all-reduce sums the partial products.
// Under sequence parallelism each rank seeds its own rows' residual into the shared buffer, and
// the reduce-scatter leaves each its rows of the sum. The adapter's A is cut by input columns as
// the weight is: each rank's s·(inp·Aᵀ)·Bᵀ is a partial product the same sum completes. DoRA's
// scale applies to the completed sum: z is summed first (DoraZ), then each rank adds g ⊙ z and the
// bias to its residual rows.
template <typename T>
void RowParallelForward(Transformer::Impl& m, T* out, const T* residual, const T* inp,
                        const T* weight, const float* bias, int K, const LoraPair<T>& lora) {
  const int BT = m.B * m.T, C = m.cfg.n_embd;
  if (lora.mag) {
    auto [z, g] = DoraZ(m, inp, weight, K, C, lora);
    if (DoraMasked(m, lora)) {
      // (x − x̃)·Wᵀ + b summed over the ranks as a plain product's is, then g ⊙ z.
      RowParallelForward(m, out, residual, DoraRemainder(m, inp, lora), weight, bias, K,
                         LoraPair<T>{});
      KEEL_PROFILED("lora", m.be->DoraScale(out, z, g, nullptr, m.R, C, true));
      return;
    }
    if (out != residual) m.be->Copy(out, residual, sizeof(T) * m.R * C);
    KEEL_PROFILED("lora", m.be->DoraScale(out, z, g, bias, m.R, C, true));
    return;
  }
  T* sum = m.sp ? m.Act<T>("gathered") : out;
  if (m.sp) {
    m.be->Zero(sum, sizeof(T) * BT * C);
    m.be->Copy(sum + size_t(m.row0) * C, residual, sizeof(T) * m.R * C);
  } else if (m.lead) {
    m.be->Copy(out, residual, sizeof(T) * BT * C);
  } else {
    m.be->Zero(out, sizeof(T) * BT * C);
  }
  KEEL_PROFILED("matmul_fwd",
                m.be->MatmulForward(sum, inp, weight, m.lead ? bias : nullptr, BT, K, C,
                                    /*accumulate=*/true));
  LoraForward(m, sum, inp, lora);
  KEEL_PROFILED("tp_comm", m.SumRows(sum, out));
}

// After the adapted product's backward wrote dx (B·T, a.in) from dout: adds the adapter's part,
// dA and dB. x·Aᵀ is recomputed rather than kept (r columns: a small product).
template <typename T>
void LoraBackward(Transformer::Impl& m, T* dx, const T* dout, const T* x, const LoraPair<T>& a) {
  if (!a.A) return;
  const int BT = m.B * m.T, r = m.cfg.lora_rank;
  T* h = m.Act<T>("lora_h");
  T* dh = m.Act<T>("lora_dh");
  const T* xd = LoraInput(m, x, a);
  KEEL_PROFILED("lora", m.be->MatmulForward(h, xd, a.A, nullptr, BT, a.in, r));
  // dh = s·dout·B, dB += s·doutᵀ·h; then dx += dh·A, dA += dhᵀ·x (x masked: the mask, again, on
  // dh·A before it joins dx).
  KEEL_PROFILED("lora", m.be->MatmulBackward(dh, a.dB, nullptr, dout, h, a.B, BT, r, a.out,
                                             m.cfg.lora_scale()));
  if (xd == x) {
    KEEL_PROFILED("lora", m.be->MatmulBackward(dx, a.dA, nullptr, dh, x, a.A, BT, a.in, r, 1.0f,
                                               /*accumulate=*/true));
    return;
  }
  T* dxd = m.Act<T>("lora_dx");
  KEEL_PROFILED("lora", m.be->MatmulBackward(dxd, a.dA, nullptr, dh, xd, a.A, BT, a.in, r));
  KEEL_PROFILED("lora", m.be->Dropout(dx, dxd, BT, a.in, LoraMask(m, a), /*accumulate=*/true));
}

// The backward of an adapted product out = x·Wᵀ + bias + its adapter's part (B·T rows, K input
// columns, N outputs): dx written from dout, dW and db accumulated (null: frozen, as a LoRA
// layout's are), and the adapter's gradients. DoRA under dropout: y = (x − x̃)·Wᵀ + b + g ⊙ z, so
// dx = du − D(du) + D(∂z·W) + the adapter's part, du = dout·W (D the forward's mask).
template <typename T>
void AdaptedBackward(Transformer::Impl& m, T* dx, float* dW, float* db, const T* dout, const T* x,
                     const T* W, int K, int N, const LoraPair<T>& a) {
  KEEL_CHECK(!a.mag || (!dW && !db), "Transformer: DoRA's base is frozen");
  const int BT = m.B * m.T;
  const T* dz = DoraBackward(m, dout, a);
  if (!DoraMasked(m, a)) {
    KEEL_PROFILED("matmul_bwd", m.be->MatmulBackward(dx, dW, db, dz, x, W, BT, K, N));
  } else {
    KEEL_PROFILED("matmul_bwd", m.be->MatmulBackward(dx, dW, db, dout, x, W, BT, K, N));
    KEEL_PROFILED("lora", m.be->Dropout(dx, dx, BT, K, MinusMask(m, a), /*accumulate=*/true));
    T* t = m.Act<T>("lora_dx");
    KEEL_PROFILED("matmul_bwd", m.be->MatmulBackward(t, nullptr, nullptr, dz, x, W, BT, K, N));
    KEEL_PROFILED("lora", m.be->Dropout(dx, t, BT, K, LoraMask(m, a), /*accumulate=*/true));
  }
  LoraBackward(m, dx, dz, x, a);
}

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

// A block's matrix products with their adapters, on the Transformer internals
// (transformer_impl.h): LoRA's low-rank product (and its dropout), DoRA's rescaling, and the
// row-parallel products' tensor-parallel sums. Shared by GPT-2's blocks (transformer.cc) and
// Llama's (llama_block.cc). Internal to model/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "keel/kernels/op_args.h"
#include "keel/model/fp8_products.h"
#include "keel/model/transformer_impl.h"

namespace keel::model::internal {

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
  // The product's place, with or without an adapter: its fp8 state is found by it.
  a.layer = l;
  while (kLoraTargets[a.k] != t) ++a.k;
  if (m.cfg.lora_rank == 0 || !(m.cfg.lora_targets & t)) return a;
  const std::string mod = "h." + std::to_string(l) + "." + LoraModule(m.cfg.llama(), t);
  const ParamInfo& A = m.layout.Find(mod + ".lora_A.weight");
  const ParamInfo& B = m.layout.Find(mod + ".lora_B.weight");
  a.A = m.At(w, s, A), a.B = m.At(w, s, B);
  a.dA = m.WeightGrad(g, A, s), a.dB = m.WeightGrad(g, B, s);
  a.in = A.shape[1], a.out = B.shape[0];  // this rank's shard's (ParamLayout::Stage's TpCut)
  a.tag = uint64_t(l) * 16 + t;
  a.col0 = A.tp_axis == 1 ? uint32_t(m.tp_rank * a.in) : 0;
  a.row_parallel = t == kLoraProj || t == kLoraFcProj;
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

// The fp8 state of the product `a` belongs to (fp8_products.h), or null where it runs in the
// working dtype.
template <typename T>
Fp8Product* Fp8Of(Transformer::Impl& m, const LoraPair<T>& a) {
  if constexpr (!std::is_same_v<T, bf16>) return nullptr;
  return Fp8Of(m, a.layer, a.k, a.A != nullptr);
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
    sq[o] = kernels::DoraInverseNorm(n);
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
  if (Fp8Product* f = Fp8Of(m, a))
    return Fp8Forward(m, *f, out, x, weight, bias, m.B * m.T, K, N, false);
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
  if (Fp8Product* f = Fp8Of(m, lora)) {  // each rank's partial product on its own shards' scales
    Fp8Forward(m, *f, sum, inp, weight, m.lead ? bias : nullptr, BT, K, C, /*accumulate=*/true);
  } else {
    KEEL_PROFILED("matmul_fwd",
                  m.be->MatmulForward(sum, inp, weight, m.lead ? bias : nullptr, BT, K, C,
                                      /*accumulate=*/true));
    LoraForward(m, sum, inp, lora);
  }
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
  if (Fp8Product* f = Fp8Of(m, a)) {
    Fp8Backward(m, *f, dx, dW, db, dz, x, W, BT, K, N);
  } else if (!DoraMasked(m, a)) {
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

}  // namespace keel::model::internal

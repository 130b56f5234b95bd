// fp8 block products (ModelConfig::fp8; core/fp8.h) on the Transformer internals. A product
// out = x·Wᵀ of blocks 1 … n_layer − 2 multiplies what fp8 tensor cores would see: x and W each
// rounded to E4M3 at its tracker's scale, and in backward ∂out rounded to E5M2. On fp8 hardware
// (Backend::NativeFp8) the backend quantizes and multiplies (cuBLASLt); elsewhere the product is
// emulated: Backend::Fp8Round writes the rounded tensors, exact in bf16 with power-of-two scales,
// into activation buffers, and the bf16 product with fp32 accumulation is the fp8 product (on the
// CPU, slower by the rounding passes). The bias gradient comes from the unrounded ∂out, as
// Transformer Engine's fused cast does. Adapted (LoRA) products stay in the working dtype. Under
// tensor parallelism each rank scales the tensors it holds (a weight's shard, a row-parallel
// input's columns): every partial product is an fp8 product of its own, and the step's judgement
// (TrainStep::Fp8EndStep) reduces the amaxes over the group, so delayed scales and fallbacks are
// shared. Used by adapted_products.h's product paths. Internal to model/.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include "keel/model/transformer_impl.h"

namespace keel::model::internal {

// m.fp8 from m.cfg: a product state per block of the stage (the Transformer's constructor), and
// the record files when KEEL_FP8_RECORD names a folder.
void Fp8Setup(Transformer::Impl& m);

// The fp8 state of block `layer`'s product k (kLoraTargets' order), or null where the product
// runs in the working dtype: fp8 off, the first or last block, a block that fell back, a product
// with an adapter.
Fp8Product* Fp8Of(Transformer::Impl& m, int layer, int k, bool adapted);

// The step's amax of every tracker of the stage's fp8 products (non-finite ones as +inf), in a
// fixed order, for the ranks that share them to reduce; and the judgement of the step with the
// reduced values: one line per block that falls back to bf16 from the next step on.
std::vector<float> Fp8StepAmax(const Transformer::Impl& m);
std::vector<std::string> Fp8EndStep(Transformer::Impl& m, const std::vector<float>& amax);

// The stage's fp8 state as Fp8StateFloats floats, for a checkpoint: per block its fallback
// flag, then per tracker (3 per product) its history's length and the history, padded to the
// recipe's length. Fp8LoadState puts back what Fp8SaveState wrote.
size_t Fp8StateFloats(const Transformer::Impl& m);
void Fp8SaveState(const Transformer::Impl& m, float* out);
void Fp8LoadState(Transformer::Impl& m, const float* in);

// Appends a view to the record (Fp8State): the tensor in, what came out, its scale and amax.
void Fp8Record(Transformer::Impl& m, const Fp8Tracker& t, const void* in, const void* out, size_t n,
               float scale, float amax);

// `x` (n elements) as the fp8 product sees it, in the activation buffer `buf`.
template <typename T>
const T* Fp8View(Transformer::Impl& m, Fp8Tracker& t, const T* x, size_t n, const char* buf) {
  const float amax = m.be->AbsMax(x, n);
  const float scale = t.Scale(amax, m.fp8.observe);
  T* out = m.Act<T>(buf);
  m.be->Fp8Round(out, x, n, scale, t.format());
  if (m.fp8.views_left > 0) Fp8Record(m, t, x, out, n, scale, amax);
  return out;
}

// out (M, N) = x (M, K)·wᵀ + bias (+= out with `accumulate`) as product `f`'s fp8 product: on
// fp8 hardware (Backend::NativeFp8) the backend's, else emulated through the views above.
template <typename T>
void Fp8Forward(Transformer::Impl& m, Fp8Product& f, T* out, const T* x, const T* w,
                const float* bias, int M, int K, int N, bool accumulate) {
  if constexpr (std::is_same_v<T, bf16>) {
    if (m.be->NativeFp8(M, K, N)) {
      float sx = 0, sw = 0;
      KEEL_PROFILED("fp8", sx = f.x.Scale(m.be->AbsMax(x, size_t(M) * K), m.fp8.observe));
      KEEL_PROFILED("fp8", sw = f.w.Scale(m.be->AbsMax(w, size_t(N) * K), m.fp8.observe));
      KEEL_PROFILED("matmul_fwd",
                    m.be->MatmulFp8Forward(out, x, w, bias, M, K, N, sx, sw, accumulate));
      return;
    }
  }
  const T *xs = nullptr, *ws = nullptr;
  KEEL_PROFILED("fp8", xs = Fp8View(m, f.x, x, size_t(M) * K, "fp8_x"));
  KEEL_PROFILED("fp8", ws = Fp8View(m, f.w, w, size_t(N) * K, "fp8_w"));
  KEEL_PROFILED("matmul_fwd", m.be->MatmulForward(out, xs, ws, bias, M, K, N, accumulate));
}

// Its backward: dx (M, K) written, dW (N, K) and db (N) accumulated (null: not wanted). The bias
// gradient comes from the unrounded dout; x and w are rounded as the forward rounded them (their
// scale again: the same amax, or the step's delayed scale).
template <typename T>
void Fp8Backward(Transformer::Impl& m, Fp8Product& f, T* dx, float* dW, float* db, const T* dout,
                 const T* x, const T* w, int M, int K, int N) {
  if (db)
    KEEL_PROFILED("matmul_bwd", m.be->MatmulBackward<T>(nullptr, nullptr, db, dout, x, w, M, K, N));
  if constexpr (std::is_same_v<T, bf16>) {
    if (m.be->NativeFp8(M, K, N)) {
      float sdy = 0, sx = 0, sw = 0;
      KEEL_PROFILED("fp8", sdy = f.dy.Scale(m.be->AbsMax(dout, size_t(M) * N), m.fp8.observe));
      KEEL_PROFILED("fp8", sx = f.x.Scale(m.be->AbsMax(x, size_t(M) * K), m.fp8.observe));
      KEEL_PROFILED("fp8", sw = f.w.Scale(m.be->AbsMax(w, size_t(N) * K), m.fp8.observe));
      KEEL_PROFILED("matmul_bwd",
                    m.be->MatmulFp8Backward(dx, dW, dout, x, w, M, K, N, sdy, sx, sw));
      return;
    }
  }
  const T *dys = nullptr, *xs = nullptr, *ws = nullptr;
  KEEL_PROFILED("fp8", dys = Fp8View(m, f.dy, dout, size_t(M) * N, "fp8_dy"));
  KEEL_PROFILED("fp8", xs = Fp8View(m, f.x, x, size_t(M) * K, "fp8_x"));
  KEEL_PROFILED("fp8", ws = Fp8View(m, f.w, w, size_t(N) * K, "fp8_w"));
  KEEL_PROFILED("matmul_bwd", m.be->MatmulBackward(dx, dW, nullptr, dys, xs, ws, M, K, N));
}

}  // namespace keel::model::internal

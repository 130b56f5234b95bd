// fp8 block products (ModelConfig::fp8; core/fp8.h) on the Transformer internals. A product
// out = x·Wᵀ of blocks 1 … n_layer − 2 multiplies what fp8 tensor cores would see: x and W each
// rounded to E4M3 at its tracker's scale, and in backward ∂out rounded to E5M2, then the working
// dtype's product (Backend::Fp8Round: with power-of-two scales the rounded tensors are exact in
// bf16, so a bf16 product with fp32 accumulation is the fp8 product; on the CPU this is the
// emulation, slow by the rounding passes). The bias gradient comes from the unrounded ∂out, as
// Transformer Engine's fused cast does. Adapted (LoRA) products stay in the working dtype.
// Used by adapted_products.h's product paths. Internal to model/.
#pragma once

#include <cstddef>
#include <string>
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

// Appends a view to the record (Fp8State): the tensor in, what came out, its scale and amax.
void Fp8Record(Transformer::Impl& m, const Fp8Tracker& t, const void* in, const void* out, size_t n,
               float scale, float amax);

// `x` (n elements) as the fp8 product sees it, in the activation buffer `buf`.
template <typename T>
const T* Fp8View(Transformer::Impl& m, Fp8Tracker& t, const T* x, size_t n, const char* buf) {
  const float amax = m.be->AbsMax(x, n);
  const float scale = t.Scale(amax);
  T* out = m.Act<T>(buf);
  m.be->Fp8Round(out, x, n, scale, t.format());
  if (m.fp8.views_left > 0) Fp8Record(m, t, x, out, n, scale, amax);
  return out;
}

}  // namespace keel::model::internal

// Rotary position embedding (Su et al. 2021) in Hugging Face Llama's layout ("rotate half"): for
// each head vector x of hs channels and i < hs/2, with angle a = pos · θ^(-2i/hs),
//   x[i]        ← x[i]·cos a − x[i + hs/2]·sin a
//   x[i + hs/2] ← x[i + hs/2]·cos a + x[i]·sin a
// applied in place to the query and key heads of a fused q, k, v row.
//
// Legend: B batch, T time, NH query heads, NKV key/value heads, hs head size.
// qkv (B, T, (NH + 2·NKV)·hs): per position NH query heads, NKV key heads, NKV value heads.
// Position t of every sequence is pos0 + t (pos0 > 0: decoding after a KV cache).
// Backward rotates the gradient by −a, in place: a rotation's transpose is its inverse, so no
// activation needs saving. Angles are computed in float64 and rounded once.
#pragma once

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

template <typename T>
void RopeForward(T* qkv, int B, int T_, int NH, int NKV, int hs, float theta, int pos0 = 0);

template <typename T>
void RopeBackward(T* dqkv, int B, int T_, int NH, int NKV, int hs, float theta, int pos0 = 0);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

// Token + position embedding.
//
// Legend: B batch, T time, C channels, V (padded) vocabulary rows of wte, maxT rows of wpe.
// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]
// Backward *adds* into dwte/dwpe (fp32). It is deterministic whatever the thread count: threads
// split the channels, and each walks the tokens in order.
#pragma once

#include <climits>
#include <cstdint>

#include "keel/core/dtype.h"
#include "keel/kernels/cpu/isa.h"

namespace keel::kernels::cpu::inline KEEL_ISA_NS {

// A vocabulary-parallel shard passes the token rows it holds, [v0, v1), with `wte`/`dwte` at row
// v0: other tokens contribute zero (another rank adds them). A null `wpe` adds no position term
// (and a null `dwpe` takes no gradient): Llama has no learned positions.
template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C,
                    int v0 = 0, int v1 = INT_MAX);

template <typename T>
void EncoderBackward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B, int T_,
                     int C, int v0 = 0, int v1 = INT_MAX);

}  // namespace keel::kernels::cpu::inline KEEL_ISA_NS

// Context parallelism's attention (parallel.cp): each rank holds two chunks of every sequence
// (parallel/zigzag.h) and computes attention for their queries against the keys and values of
// the whole sequence, which it gathers from the cp group once per layer (Llama 3's all-gather
// variant: Dubey et al. 2024, section 3.3.2). Backward gathers them again rather than keeping
// them (the memory cp exists to save), and the keys' and values' gradients, partial sums over
// each rank's queries, are reduce-scattered back to the ranks that hold those positions.
//
// The kernel is keel's flash attention over the whole sequence, unchanged: the positions other
// ranks' queries hold are stand-in rows (query zero, output gradient zero) whose document starts
// at themselves, so they see one key, cost one diagonal tile per 64 rows, and add exact zeros to
// the key and value gradients. A real row's arithmetic is the single-rank kernel's, tile for
// tile: the forward is bitwise the one-process forward; only the gradient sums over cp ranks
// change order.
//
// Buffers: the activation plan's shared "cp_*" ones (activations.h), one layer at a time: the
// whole sequence's q, k, v, output, its gradient, the statistics, the gathered keys and values.
// They are the price of this variant: cp·B·T·(2·qkv + 2·C + 2·kv) elements beside activations
// that are 1/cp of one rank's.
//
//   CpAttentionForward(be, cp, shape, buffers, out, lse, qkv);   // collective over cp.comm
#pragma once

#include <cstdint>

#include "keel/kernels/backend.h"
#include "keel/parallel/comm.h"

namespace keel::model {

// This rank's attention: B sequences of T local rows (two chunks each), its query channels C,
// query heads NH, key/value heads NKV (tensor parallelism: its shard's).
struct CpShape {
  int B = 1, T = 2, C = 0, NH = 1, NKV = 1;
};

// The whole sequence's stand-ins (cp·T rows each), in the run's dtype unless named.
template <typename E>
struct CpBuffers {
  E* kv_local;   // (B, T, 2·kv): this rank's keys and values; backward: their gradients
  E* kv_all;     // (cp, B, T, 2·kv): every rank's, by rank; backward: the gradients by owner
  E* qkv;        // (B, cp·T, qkv)
  E* out;        // (B, cp·T, C)
  E* dout;       // (B, cp·T, C)
  E* dqkv;       // (B, cp·T, qkv)
  float* lse;    // (B, NH, cp·T)
  int32_t* doc;  // (B, cp·T): 0 on this rank's rows, a row's own position elsewhere
};

struct CpStats {
  double wait_ms = 0;  // waited on the cp group's collectives (none overlaps compute yet)
  double bytes = 0;    // sent into them
};

// out (B, T, C) and lse (B, NH, T) of this rank's rows; qkv (B, T, qkv) after RoPE.
template <typename E>
void CpAttentionForward(const kernels::Backend& be, parallel::Comm& cp, double timeout_s,
                        const CpShape& s, const CpBuffers<E>& buf, E* out, float* lse, const E* qkv,
                        CpStats* stats);

// dqkv (B, T, qkv) overwritten: the queries' gradients and this rank's positions' keys' and
// values' gradients summed over the cp group.
template <typename E>
void CpAttentionBackward(const kernels::Backend& be, parallel::Comm& cp, double timeout_s,
                         const CpShape& s, const CpBuffers<E>& buf, E* dqkv, const E* dout,
                         const E* qkv, const E* out, const float* lse, CpStats* stats);

}  // namespace keel::model

// Context parallelism's attention (parallel.cp): each rank holds two chunks of every sequence
// (parallel/zigzag.h) and computes attention for their queries against the keys and values of
// the whole sequence, in one of two ways ([parallel] cp_comm):
//
//   ring       (Liu et al. 2023; Megatron-LM's p2p) the keys and values travel around the cp
//              ring, one rank's pair of chunks per step, each sent on while this rank computes
//              its queries against them; the blocks' outputs are merged by their log-sum-exps.
//              Backward sends the keys and values around again, with their gradients (fp32)
//              accumulating as they go, home after cp steps. Buffers of 2·T rows: O(T/cp).
//   allgather  (Llama 3, Dubey et al. 2024, section 3.3.2) every rank's keys and values gathered
//              once per layer; backward gathers them again and reduce-scatters their gradients.
//              One kernel call over the whole sequence; buffers of the whole sequence's rows.
//
// Both run keel's flash attention kernel unchanged, over stand-in rows: the ring's block puts
// the visiting keys first and this rank's queries after them, each query row seeing the prefix
// of keys at positions before its own (key_end); the all-gather's puts every row at its position,
// other ranks' rows seeing themselves alone (doc_start), at one diagonal tile per 64 rows. A
// stand-in row adds exact zeros to the gradients. The all-gather forward is bitwise the one-
// process forward; the ring's merge and both variants' gradient sums over ranks change rounding.
//
// Neither keeps the gathered keys and values for backward: they travel again (the memory that cp
// exists to save).
//
//   CpAttentionForward(be, comm, CpComm::kRing, 600, shape, buffers, out, lse, qkv, &stats);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "keel/kernels/backend.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/zigzag.h"

namespace keel::model {

using parallel::CpComm;  // parallel/zigzag.h: [parallel] cp_comm

// This rank's attention: B sequences of T local rows (two chunks each), its query channels C,
// query heads NH, key/value heads NKV (tensor parallelism: its shard's). doc_start (B·T, may be
// null): document masking, the position in its whole sequence where each row's document begins.
struct CpShape {
  int B = 1, T = 2, C = 0, NH = 1, NKV = 1;
  const int32_t* doc_start = nullptr;
};

// The buffers one layer's attention uses, shared by all layers (the activation plan's "cp_*":
// CpBufferSizes). A block's rows W: 2·T (ring) or cp·T (allgather). E: the run's dtype.
template <typename E>
struct CpBuffers {
  E* kv[2];       // ring: the keys and values held now and the next (B, T, 2·kv) each;
                  // allgather: this rank's (B, T, 2·kv), then every rank's (cp, B, T, 2·kv)
  float* dkv[2];  // ring: their gradients travelling with them (fp32); allgather: unused
  E* qkv;         // (B, W, qkv)
  E* out;         // (B, W, C)
  E* dout;        // (B, W, C)
  E* dqkv;        // (B, W, qkv)
  float* lse;     // (B, NH, W)
  int32_t* doc;   // (B, W): each row's first key
  int32_t* end;   // (B, W): ring: one past each row's last key
  float* acc;     // (B, T, C): ring: the merged output (forward), the queries' gradient (backward)
};

// The buffers where `find(name)` places CpBufferSizes' (null: not this variant's); `kv` elements
// of keys and values per rank (B·T·2·kv).
template <typename E, typename Find>
CpBuffers<E> CpBuffersAt(Find&& find, size_t kv) {
  E* k = reinterpret_cast<E*>(find("cp_kv"));
  float* dk = reinterpret_cast<float*>(find("cp_dkv"));
  return {{k, k + kv},
          {dk, dk ? dk + kv : nullptr},
          reinterpret_cast<E*>(find("cp_qkv")),
          reinterpret_cast<E*>(find("cp_out")),
          reinterpret_cast<E*>(find("cp_dout")),
          reinterpret_cast<E*>(find("cp_dqkv")),
          reinterpret_cast<float*>(find("cp_lse")),
          reinterpret_cast<int32_t*>(find("cp_doc")),
          reinterpret_cast<int32_t*>(find("cp_end")),
          reinterpret_cast<float*>(find("cp_acc"))};
}

struct CpBufferSize {
  const char* name;
  size_t elem_bytes, elems;
};
// The buffers of `comm` for cp ranks, `rows` (= B·T) local rows, `qkv` fused columns of which `C`
// are the queries', NH heads, elements of `elem` bytes.
std::vector<CpBufferSize> CpBufferSizes(CpComm comm, int cp, size_t rows, size_t qkv, size_t C,
                                        size_t NH, size_t elem);

struct CpStats {
  double wait_ms = 0;  // waited on the cp group's transfers (the ring's: only what compute did
                       // not cover)
  double bytes = 0;    // sent into them
};

// out (B, T, C) and lse (B, NH, T) of this rank's rows; qkv (B, T, qkv) after RoPE. Collective
// over `cp`.
template <typename E>
void CpAttentionForward(const kernels::Backend& be, parallel::Comm& cp, CpComm comm,
                        double timeout_s, const CpShape& s, const CpBuffers<E>& buf, E* out,
                        float* lse, const E* qkv, CpStats* stats);

// dqkv (B, T, qkv) overwritten: the queries' gradients and this rank's positions' keys' and
// values' gradients summed over the cp group.
template <typename E>
void CpAttentionBackward(const kernels::Backend& be, parallel::Comm& cp, CpComm comm,
                         double timeout_s, const CpShape& s, const CpBuffers<E>& buf, E* dqkv,
                         const E* dout, const E* qkv, const E* out, const float* lse,
                         CpStats* stats);

}  // namespace keel::model

// Sums of fp32 gradients over a data-parallel group that travel in a wire format ([parallel]
// grad_comm; grad_wire.h says what each costs and loses).
//
// fp32 is the communicator's own reduce-scatter or all-reduce. bf16 and int8 are built so that no
// rank ever adds two rounded values: each rank encodes its pieces (int8: with its error
// feedback), an all-to-all sends piece r to rank r, and rank r decodes the ranks' pieces and sums
// them in fp32, in rank order. That is a reduce-scatter. An all-reduce then encodes each owner's
// sum (int8: what rounding loses goes into the owner's residual for those elements, so that its
// next send carries it) and all-gathers it; every rank, the owner too, decodes the same bytes, so
// the replicas' gradients stay identical. The encoding and decoding run on the communicator's
// thread between the transfers (Comm::ThenAsync), not on the caller's.
//
//   auto w = AllReduceOnWire(dp, GradWire::kInt8, grads, n, residual);  // residual: n floats
//   ... backward goes on ...
//   w->Wait(timeout_s);
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "keel/parallel/comm.h"
#include "keel/parallel/grad_wire.h"

namespace keel::parallel {

// In place over x (n host floats), split into the group's ZeRO-style equal pieces. `err`: int8's
// error feedback, n floats kept by the caller between steps (null: none; ignored by fp32, bf16).
// x and err must stay untouched until Wait returns true.
std::unique_ptr<Work> AllReduceOnWire(Comm& c, GradWire w, float* x, size_t n, float* err);

// As Comm::ReduceScatterSumAsync in place: rank r's part (counts[r] elements) of the sum of x
// (Σ counts floats) at the start of x when Wait returns. `err`: as above, Σ counts floats.
std::unique_ptr<Work> ReduceScatterOnWire(Comm& c, GradWire w, float* x,
                                          const std::vector<size_t>& counts, float* err);

// The bytes of send and receive buffers kept for the next reduction (none in flight holds them).
size_t WireScratchBytesFree();

}  // namespace keel::parallel

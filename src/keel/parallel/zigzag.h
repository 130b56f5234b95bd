// Where each context-parallel rank's tokens are (parallel.cp): a sequence of T tokens is cut into
// 2·cp chunks of L = T / (2·cp), and rank r holds chunks r and 2·cp − 1 − r, in that order, as
// its T / cp local rows (the head-tail, or zigzag, split of TorchTitan and Megatron-LM). Under a
// causal mask chunk k attends to k + 1 chunks' keys, so every rank's pair does the same work:
// (r + 1) + (2·cp − r) = 2·cp + 1 chunk pairs.
//
//   ZigzagPosition(/*cp=*/2, /*rank=*/1, /*local_T=*/4, /*t=*/3)   // == 5: chunks 1 and 2 of 4
//   ZigzagSlice(full, mine, B, T, cp, rank);                       // (B, T) -> (B, T/cp)
#pragma once

#include <cstddef>
#include <cstdint>

namespace keel::parallel {

// How the keys and values of the other ranks' chunks reach a rank's attention
// (model/context_parallel.h): around a ring of cp ranks, one rank's at a time, or all gathered.
enum class CpComm { kRing, kAllGather };
inline const char* CpCommName(CpComm c) { return c == CpComm::kRing ? "ring" : "allgather"; }

// The position in the whole sequence of local row t (0 <= t < local_T = T / cp).
inline int ZigzagPosition(int cp, int rank, int local_T, int t) {
  const int L = local_T / 2;
  return t < L ? rank * L + t : (2 * cp - 1 - rank) * L + (t - L);
}

// `mine` (B, T/cp) = this rank's rows of each of the B sequences of `full` (B, T).
template <typename E>
void ZigzagSlice(const E* full, E* mine, int B, int T, int cp, int rank) {
  const int local_T = T / cp;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < local_T; ++t)
      mine[size_t(b) * local_T + t] = full[size_t(b) * T + ZigzagPosition(cp, rank, local_T, t)];
}

}  // namespace keel::parallel

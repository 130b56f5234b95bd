#include "keel/parallel/dims.h"

#include <algorithm>

namespace keel::parallel {

RankCoords Coords(const ParallelDims& d, int rank) {
  RankCoords c;
  c.tp = rank % d.tp;
  c.cp = (rank / d.tp) % d.cp;
  c.dp = (rank / (d.tp * d.cp)) % d.dp;
  c.pp = rank / (d.tp * d.cp * d.dp);
  return c;
}

int RankOf(const ParallelDims& d, const RankCoords& c) {
  return ((c.pp * d.dp + c.dp) * d.cp + c.cp) * d.tp + c.tp;
}

ShardRange Shard(size_t total, int dp, int r) {
  ShardRange s;
  s.size = (total + size_t(dp) - 1) / size_t(dp);
  s.lo = std::min(total, s.size * size_t(r));
  s.hi = std::min(total, s.size * size_t(r + 1));
  return s;
}

std::string DimsName(const ParallelDims& d) {
  return "dp=" + std::to_string(d.dp) + " tp=" + std::to_string(d.tp) +
         " pp=" + std::to_string(d.pp) + " zero=" + std::to_string(d.zero) +
         (d.cp > 1 ? " cp=" + std::to_string(d.cp) : "");
}

}  // namespace keel::parallel

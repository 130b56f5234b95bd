#include "keel/resilience/sdc.h"

#include <xxhash.h>

#include <map>

namespace keel::resilience {

Disagreement FindDisagreement(const std::vector<uint64_t>& hashes) {
  Disagreement d;
  std::map<uint64_t, int> votes;
  for (uint64_t h : hashes) ++votes[h];
  if (votes.size() <= 1) return d;
  uint64_t best = 0;
  int most = 0;
  for (const auto& [h, n] : votes)
    if (n > most) best = h, most = n;
  d.majority = 2 * most > int(hashes.size());
  for (size_t r = 0; r < hashes.size(); ++r)
    if (!d.majority || hashes[r] != best) d.suspects.push_back(int(r));
  return d;
}

uint64_t HashBytes(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

}  // namespace keel::resilience

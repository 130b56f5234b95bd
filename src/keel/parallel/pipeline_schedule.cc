#include "keel/parallel/pipeline_schedule.h"

#include <algorithm>

#include "keel/core/error.h"

namespace keel::parallel {

std::vector<PipeUnit> PipelineUnits(int p, int s, int v, int m) {
  KEEL_CHECK(p >= 1 && s >= 0 && s < p && v >= 1 && m >= 1 && (v == 1 || m % p == 0),
             "PipelineUnits: interleaving needs m % p == 0");
  const int n = m * v;
  // Unit k of a direction: groups of p micro-batches go through the chunks in turn.
  auto unit = [&](int k, bool forward) {
    const int c = (k / p) % v;
    return PipeUnit{forward, forward ? c : v - 1 - c, (k / (p * v)) * p + k % p};
  };
  const int warmup = v == 1 ? std::min(p - s - 1, m) : std::min((p - s - 1) * 2 + (v - 1) * p, n);
  std::vector<PipeUnit> out;
  out.reserve(size_t(2 * n));
  for (int k = 0; k < warmup; ++k) out.push_back(unit(k, true));
  for (int k = 0; k + warmup < n; ++k) {
    out.push_back(unit(k + warmup, true));
    out.push_back(unit(k, false));
  }
  for (int k = n - warmup; k < n; ++k) out.push_back(unit(k, false));
  return out;
}

std::vector<int> PipelineSlots(int p, int s, int v, int m) {
  std::vector<int> live(size_t(v), 0), most(size_t(v), 1);
  for (const PipeUnit& u : PipelineUnits(p, s, v, m)) {
    int& n = live[size_t(u.chunk)];
    n += u.forward ? 1 : -1;
    most[size_t(u.chunk)] = std::max(most[size_t(u.chunk)], n);
  }
  return most;
}

double PipelineBubble(int p, int m, int v) { return double(p - 1) / (m + p - 1) / v; }

}  // namespace keel::parallel

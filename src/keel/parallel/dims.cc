#include "keel/parallel/dims.h"

#include <algorithm>
#include <utility>

#include "keel/core/error.h"

namespace keel::parallel {

RankCoords Coords(const ParallelDims& d, int rank) {
  RankCoords c;
  c.tp = rank % d.tp;
  c.dp = (rank / d.tp) % d.dp;
  c.pp = rank / (d.tp * d.dp);
  return c;
}

int RankOf(const ParallelDims& d, const RankCoords& c) {
  return (c.pp * d.dp + c.dp) * d.tp + c.tp;
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
         " pp=" + std::to_string(d.pp) + " zero=" + std::to_string(d.zero);
}

void ValidateDims(const ParallelDims& d, const DimsInputs& in, const std::string& prefix) {
  auto s = [](long v) { return std::to_string(v); };
  // tp and pp first: a derived dp is only meaningful once they are.
  for (auto [name, v] : {std::pair{"tp", d.tp}, std::pair{"pp", d.pp}, std::pair{"dp", d.dp}})
    if (v < 1) ThrowBadInput(prefix + name + "=" + s(v) + ": expected an integer >= 1");
  if (d.zero < 0 || d.zero > 3)
    ThrowBadInput(prefix + "zero=" + s(d.zero) + ": expected 0, 1, 2 or 3");
  const long world = long(d.tp) * d.pp * d.dp;
  if (in.world && world != in.world)
    ThrowBadInput(prefix + "tp=" + s(d.tp) + " x pp=" + s(d.pp) + " x dp=" + s(d.dp) + " = " +
                  s(world) + " does not match the " + s(in.world) + " ranks launched");
  if (in.n_head && in.n_head % d.tp != 0)
    ThrowBadInput(prefix + "tp=" + s(d.tp) + " does not divide model.n_head=" + s(in.n_head) +
                  " (each rank holds whole heads)");
  if (in.n_kv_head && in.n_kv_head % d.tp != 0)
    ThrowBadInput(prefix + "tp=" + s(d.tp) + " does not divide model.n_kv_head=" + s(in.n_kv_head) +
                  " (each rank holds whole key/value heads)");
  if (in.ffn_hidden && in.ffn_hidden % d.tp != 0)
    ThrowBadInput(prefix + "tp=" + s(d.tp) + " does not divide model.ffn_hidden=" +
                  s(in.ffn_hidden) + " (each rank holds whole hidden units)");
  if (in.padded_vocab && in.padded_vocab % d.tp != 0)
    ThrowBadInput(prefix + "tp=" + s(d.tp) + " does not divide model.vocab_size padded to " +
                  s(in.padded_vocab) + " (each rank holds whole rows of the embedding)");
  if (in.n_layer && in.n_layer % d.pp != 0)
    ThrowBadInput(prefix + "pp=" + s(d.pp) + " does not divide model.n_layer=" + s(in.n_layer) +
                  " (each stage holds whole layers)");
  if (in.global_batch) {
    const long micro = in.micro_batch > 0 ? in.micro_batch : 1;
    const long unit = long(d.dp) * micro;
    if (in.global_batch % unit != 0)
      ThrowBadInput(prefix + "global batch " + s(in.global_batch) + " is not divisible by dp=" +
                    s(d.dp) + " x micro-batch " + s(micro) + " = " + s(unit));
  }
}

}  // namespace keel::parallel

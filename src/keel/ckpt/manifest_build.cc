#include "keel/ckpt/manifest_build.h"

#include <map>

#include "keel/core/error.h"

namespace keel::ckpt {

Manifest SkeletonManifest(const StateView& meta, int world) {
  Manifest m;
  m.step = meta.step;
  m.tokens = meta.tokens;
  m.state = meta.state;
  // The trainer states the layout; a writer used alone (tools, tests) says how many ranks wrote.
  if (!m.state.contains("layout")) m.state["layout"]["dp"] = world;
  for (const TensorSpec& t : meta.all_tensors.empty() ? meta.tensors : meta.all_tensors)
    for (const FlatBuffer& b : meta.buffers)
      m.tensors.push_back({t.name, b.kind, "f32", t.shape, {}});
  return m;
}

void AddRankPieces(Manifest& m,
                   const std::vector<std::pair<std::string, nlohmann::json>>& sidecars) {
  std::map<std::pair<std::string, std::string>, std::vector<Piece>> by_tensor;
  for (const auto& [side, pieces] : sidecars)
    for (const nlohmann::json& p : pieces) {
      Piece piece{p["file"],  p["offset"], p["bytes"],
                  p["start"], p["count"],  ParseHexHash(p["xxh3"], side)};
      by_tensor[{p["name"], p["kind"]}].push_back(std::move(piece));
    }
  for (TensorEntry& e : m.tensors) {
    e.pieces = by_tensor[{e.name, e.kind}];
    uint64_t covered = 0;
    for (const Piece& p : e.pieces) covered += p.bytes / 4;
    if (covered != e.numel())
      ThrowBadInput("checkpoint pieces of " + e.name + " (" + e.kind + ") cover " +
                    std::to_string(covered) + " of its " + std::to_string(e.numel()) +
                    " elements (a rank's part is missing)");
  }
  // The ranks' own state, whoever wrote it (rank 0 does not know the others' names).
  for (auto& [key, pieces] : by_tensor) {
    if (key.second != kOwnKind) continue;
    uint64_t n = 0;
    for (const Piece& p : pieces) n += p.bytes / 4;
    m.tensors.push_back({key.first, key.second, "f32", {int64_t(n)}, pieces});
  }
}

}  // namespace keel::ckpt

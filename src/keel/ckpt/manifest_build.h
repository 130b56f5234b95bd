// How a save's manifest is put together from what each rank wrote, in one place for the shared
// checkpoint's commit (writer.cc) and for a tier-0 copy assembled from holders (train/peer_tier).
//
//   Manifest m = SkeletonManifest(meta_view, world);      // rank 0, when the save begins
//   AddRankPieces(m, {{"rank_00000.json", pieces0}, ...}); // every rank's sidecar
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "keel/ckpt/manifest.h"
#include "keel/ckpt/state.h"

namespace keel::ckpt {

// The manifest of a save of `meta` by `world` ranks before its pieces are known: step, tokens,
// state, and every tensor of every kind in `meta`, with no pieces.
Manifest SkeletonManifest(const StateView& meta, int world);
// Adds every rank's pieces (its sidecar as the writer lists them, named for messages) to `m`,
// checks that they cover every tensor, and adds the ranks' own tensors. Throws keel::Error
// (bad input) naming the sidecar or the tensor that is wrong.
void AddRankPieces(Manifest& m,
                   const std::vector<std::pair<std::string, nlohmann::json>>& sidecars);

}  // namespace keel::ckpt

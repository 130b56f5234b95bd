// The layout a checkpoint records in its manifest's state ("layout"), written and read in one
// place: SavedState writes it; the resume line and the tier-0 restore (which counts the rank files
// of a copy) read how many ranks saved it.
#pragma once

#include <nlohmann/json.hpp>

#include "keel/parallel/dims.h"

namespace keel::train {

// {dp, tp, pp, zero} and cp where there is one, so that other manifests keep the keys they always
// had.
nlohmann::json LayoutJson(const parallel::ParallelDims& dims);

// dp·tp·pp·cp of a manifest state's "layout"; a key it lacks counts 1.
int RanksThatSaved(const nlohmann::json& state);
// Its dp: the number of replicas that saved it (DiLoCo's, which may differ from the resuming
// run's after the supervisor's elastic dp lost or regained a host).
int ReplicasThatSaved(const nlohmann::json& state);

}  // namespace keel::train

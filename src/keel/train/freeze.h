// [optim] freeze: which parameters a run leaves untrained.
#pragma once

#include <string>
#include <vector>

#include "keel/model/params.h"

namespace keel::train {

// One flag per parameter of `layout` (in its order): true when its name matches one of the
// comma-separated glob patterns (`*`, `?`). Throws keel::Error (bad input) naming a pattern that
// matches no parameter, since a typo would otherwise silently train everything.
std::vector<bool> FrozenParams(const std::string& patterns, const model::ParamLayout& layout);

}  // namespace keel::train

// Weights for a LoRA layout's tests: the model's initial ones, with every adapter's A and B
// random (B not zero, as after training), so that every path of an adapted product counts.
#pragma once

#include <vector>

#include "keel/core/rng.h"
#include "keel/model/config.h"
#include "keel/model/params.h"

namespace keel::model::test {

inline std::vector<float> RandomLoraWeights(const ModelConfig& cfg) {
  const ParamLayout lay = ParamLayout::Whole(cfg);
  std::vector<float> w(lay.total());
  InitParams(lay, cfg, 11, w.data());
  const Philox rng(12, 0);
  for (const ParamInfo& p : lay.params())
    if (IsLoraParam(p.name))
      for (size_t i = 0; i < p.numel; ++i)
        w[p.offset + i] = 0.05f * float(int(rng.Bits(p.offset + i)[0] % 2001) - 1000) / 1000.0f;
  return w;
}

}  // namespace keel::model::test

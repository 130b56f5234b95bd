// The activation plan: every buffer one training step needs, sized up front and placed in one
// arena. The planner calls the same function, so its byte count is the trainer's allocation.
//
// Recomputation trades time for memory: "attn" keeps one shared set of the attention sublayer's
// buffers (ln_1, qkv, attention output, row statistics) and recomputes them per layer during
// backward; "full" keeps only each block's input and recomputes the whole block.
//
//   auto plan = keel::model::PlanActivations(cfg, /*B=*/4, /*T=*/256, DType::kBF16,
//                                            Recompute::kNone);
//   plan.total_bytes;   // the arena's size
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/model/config.h"

namespace keel::model {

enum class Recompute { kNone, kAttn, kFull };
Recompute ParseRecompute(const std::string& s);  // throws on anything but none|attn|full
const char* RecomputeName(Recompute r);

struct ActivationBuffer {
  std::string name;
  size_t count = 1;  // copies: one per layer, or one shared by all layers
  size_t elem_bytes = 0;
  size_t elems = 0;   // per copy
  size_t offset = 0;  // bytes into the arena, 64-byte aligned
  size_t bytes() const { return count * elems * elem_bytes; }
};

struct ActivationPlan {
  std::vector<ActivationBuffer> buffers;
  size_t total_bytes = 0;
  const ActivationBuffer& Find(const std::string& name) const;
};

ActivationPlan PlanActivations(const ModelConfig& cfg, int B, int T, DType dtype,
                               Recompute recompute);

}  // namespace keel::model

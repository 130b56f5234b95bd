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
#include "keel/model/context_parallel.h"
#include "keel/model/params.h"

namespace keel::model {

enum class Recompute { kNone, kAttn, kFull };
Recompute ParseRecompute(const std::string& s);  // throws on anything but none|attn|full
const char* RecomputeName(Recompute r);

struct ActivationBuffer {
  std::string name;
  size_t count = 1;  // copies: per layer (and per slot), or one shared by all layers
  size_t elem_bytes = 0;
  size_t elems = 0;   // per copy
  size_t offset = 0;  // bytes into the arena, 64-byte aligned
  size_t bytes() const { return count * elems * elem_bytes; }
};

// DoRA's buffers of each adapted product, in kLoraTargets' order: its z, and its row scales then
// inverse norms (PlanActivations).
inline constexpr const char* kDoraZ[] = {"dora_z_qkv", "dora_z_proj", "dora_z_fc", "dora_z_fcp"};
inline constexpr const char* kDoraScale[] = {"dora_g_qkv", "dora_g_proj", "dora_g_fc",
                                             "dora_g_fcp"};

struct ActivationPlan {
  std::vector<ActivationBuffer> buffers;
  size_t total_bytes = 0;
  const ActivationBuffer& Find(const std::string& name) const;
};

// `stage`: the blocks this rank runs (default: all); `slots`: the micro-batches whose
// activations it keeps at once (a pipeline schedule's in-flight count; 1 without pipelining).
// Per-micro-batch buffers are kept `slots` times; recompute scratch and backward's buffers once.
// A pipeline stage also keeps, per slot, the gradient it receives from the next stage
// ("pipe_grad_in", all but the last) and the one it sends to the previous ("pipe_grad_out", all
// but the first), which stay in flight while other micro-batches compute.
// `tp`: tensor-parallel ranks. The buffers inside attention and the MLP (qkv, the attention's
// output and statistics, the MLP's hidden layer — "fch" its input, for a Llama SwiGLU's gate and
// up halves, "fch_gelu" its activation — and their gradients) hold this rank's heads and hidden
// units only (1/tp); the residual stream and LayerNorms stay whole. The last stage adds
// the vocabulary shards' per-row statistics.
// `sp` (sequence parallelism, tp > 1): the residual stream, the LayerNorms' outputs and statistics
// and the stage boundaries hold this rank's B·T/tp rows only; one shared B·T×C buffer ("gathered")
// takes a LayerNorm output all-gathered for the next product (again in backward, instead of
// keeping it), a projection's partial sum before its reduce-scatter, and the final LayerNorm's
// output for the classifier.
// `cp` (context parallelism): T is this rank's rows of each sequence (1/cp of it); the "cp_*"
// buffers hold one layer's attention blocks by `cp_comm`'s way (context_parallel.h:
// CpBufferSizes).
ActivationPlan PlanActivations(const ModelConfig& cfg, int B, int T, DType dtype,
                               Recompute recompute, const StageRange* stage = nullptr,
                               int slots = 1, int tp = 1, bool sp = false, int cp = 1,
                               CpComm cp_comm = CpComm::kRing);

}  // namespace keel::model

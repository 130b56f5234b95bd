// Where Transformer reads its weights and writes its gradients, one segment at a time
// (ParamLayout::segments(): embeddings, each block, the final LayerNorm). The model does not own
// them: a data-parallel replica holds every segment all the time, a ZeRO-3 rank gathers a block's
// weights just before the block runs and lets them go after, a ZeRO-2 rank reduces a block's
// gradients as soon as backward finishes them. The model only says what it is about to use and
// what it is done with; the strategy behind this interface decides what that costs.
//
// Calls, in order, for one micro-batch of ForwardBackward (L blocks, segment 1 + l = block l):
//   Use(0, fwd) … Use(1+l, fwd) Done(1+l, fwd) … Use(L+1, fwd)
//   Grads(0) Grads(L+1) GradsDone(L+1) Done(L+1, bwd)
//   Use(1+l, bwd) Grads(1+l) GradsDone(1+l) Done(1+l, bwd)   for l = L-1 … 0
//   Grads(0) GradsDone(0) Done(0, bwd)
// Weights(s) and Grads(s) stay valid until the matching Done / GradsDone.
#pragma once

#include <cstddef>
#include <cstdint>

namespace keel::model {

enum class Pass { kForward, kBackward };

// A segment's quantized base: its codes and scales, element 0 its first quantized element and
// first scale (ParamLayout::segment_quant_start, segment_scale_start), so that a matrix's are at
// its quant_offset and scale_offset less those; null where the base is not quantized.
struct QuantizedWeights {
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
};

class ParamAccess {
 public:
  virtual ~ParamAccess() = default;

  // Segment s's working weights (the model's dtype), element 0 = the segment's first element
  // (ParamLayout::segment_work_start: a quantized base's matrices are not among them).
  virtual const void* Weights(int s) = 0;
  // Segment s's quantized base (valid as Weights(s) is).
  virtual QuantizedWeights Quantized(int /*s*/) { return {}; }
  // The matrix products' biases in fp32 (ParamInfo::bias_index), read by bf16 runs.
  virtual const float* Biases() = 0;
  // Segment s's gradient accumulator for this micro-batch, element 0 = its first element. The
  // model adds into it; a strategy that keeps gradients elsewhere hands out zeroed scratch.
  virtual float* Grads(int s) = 0;

  virtual void Use(int /*s*/, Pass /*p*/) {}
  virtual void Done(int /*s*/, Pass /*p*/) {}
  // Segment s's gradients are final for this micro-batch.
  virtual void GradsDone(int /*s*/) {}
};

}  // namespace keel::model

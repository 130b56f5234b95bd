// AdamW over flat fp32 buffers, with global gradient-norm clipping.
//
// The optimizer owns the two moment buffers (fp32, one allocation each) and the step count. It
// sees the parameters as ranges of one flat buffer, each with its own weight-decay flag, so it
// does not depend on the model.
//
//   AdamW opt(ranges, total, hyper);
//   double norm = GlobalGradNorm(grads, total);
//   opt.Step(master, working_bf16_or_null, grads, lr, ClipScale(norm, 1.0));
//
// Moments in bf16 (18 -> 14 bytes per parameter) and master-less bf16 weights (-> 10) round
// stochastically, with draws that are a pure function of the seed, the step, the tensor and the
// element: bitwise the same whatever the ZeRO stage, dp size or thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/core/memory.h"
#include "keel/kernels/backend.h"

namespace keel::optim {

struct ParamRange {
  size_t offset = 0, numel = 0;
  bool decay = false;
  bool frozen = false;  // not updated (its moments stay zero)
  // A copy of a parameter another pipeline stage owns (the tied wte on the last stage): updated
  // like the original but left out of the gradient norm, which counts each parameter once.
  bool replica = false;
  // The range's place in the layout's working weights where `offset` counts something else: the
  // packed elements of a compact state (optim::ParamStore::trainable). SIZE_MAX: offset. AdamW
  // does not read it.
  size_t at = SIZE_MAX;
  // Its place in the working copy (model::ParamInfo::work_offset, which a quantized base moves),
  // where a compact state publishes its trained weights. AdamW does not read it either.
  size_t work = SIZE_MAX;
  // Stochastic rounding's draws (bf16 moments, master-less weights): the tensor's stream and
  // this range's first element in it, so that every layout draws the same for an element
  // (kernels::AdamWParams::round_key, index0).
  uint64_t stream = 0;
  uint64_t first = 0;
};

// A tensor's stream of draws: its name and tensor-parallel shard (0 for a tensor every tp rank
// holds whole, so that their copies stay equal; the tied wte's copy on the last pipeline stage
// draws what the first stage's draws).
uint64_t RoundStream(const std::string& name, int tp_rank);

struct AdamWHyper {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  bool bf16_moments = false;  // optim.state_dtype = "bf16": m and v stochastically rounded
  bool bf16_grads = false;    // optim.grad_dtype = "bf16": the gradients Step reads are bf16
  uint64_t seed = 0;          // of the stochastic rounding's draws
};

class AdamW {
 public:
  // Moments in `be`'s memory (fp32, or bf16 per hyper), zeroed; Step runs on `be`. Without
  // `own_moments` the caller keeps them (an offload tier) and updates through Begin and Apply.
  AdamW(std::vector<ParamRange> ranges, size_t total, const AdamWHyper& hyper,
        const kernels::Backend& be = kernels::Cpu(), bool own_moments = true);

  // One update of every range; `working` (bf16 runs) receives the rounded new master. `master`
  // null: `working` is the only copy of the weights, updated with stochastic rounding.
  // `grads`: grad_dtype() elements.
  void Step(float* master, bf16* working, const void* grads, float lr, float grad_scale);

  // Step in pieces: Begin counts the step, then Apply updates the elements [lo, lo + n) of the
  // ranges, every pointer at element lo (moments: moment_dtype()). Any cut of [0, total) into
  // slices gives Step's bits.
  struct Slice {
    float* master = nullptr;
    bf16* working = nullptr;
    void *m = nullptr, *v = nullptr;
    const void* grads = nullptr;  // grad_dtype()
    size_t lo = 0, n = 0;
  };
  void Begin() { ++step_; }
  void Apply(const Slice& s, float lr, float grad_scale) const;

  int step() const { return step_; }
  void set_step(int step) { step_ = step; }  // a resumed run continues the bias correction
  void* m() { return m_.data(); }            // moment_dtype() elements
  void* v() { return v_.data(); }
  DType moment_dtype() const { return hyper_.bf16_moments ? DType::kBF16 : DType::kF32; }
  DType grad_dtype() const { return hyper_.bf16_grads ? DType::kBF16 : DType::kF32; }
  size_t total() const { return total_; }

 private:
  std::vector<ParamRange> ranges_;
  size_t total_;
  AdamWHyper hyper_;
  const kernels::Backend* be_;
  Buffer m_, v_;
  int step_ = 0;
};

// √Σ g² of gradients in host memory (tests, the PyTorch oracle), summed in float64 over
// fixed-size blocks in order (Backend::SumSquares): the same bits whatever the thread count.
double GlobalGradNorm(const float* grads, size_t n);

// The factor that brings `norm` down to `max_norm` (1 if already below, or if max_norm is 0).
float ClipScale(double norm, float max_norm);

}  // namespace keel::optim

// The arguments of kernel operations that every backend shares.
#pragma once

#include <functional>

namespace keel::kernels {

// Vocabulary parallelism (Megatron-LM's): `wte` holds rows [v0, v0 + Vp) of the padded
// vocabulary, and `combine` turns each tile's per-row statistics over those rows — the
// log-sum-exp (-inf where the shard holds no real id) and the target's logit (0 where another
// shard holds the target) — into the whole vocabulary's, in place: the tensor-parallel ranks'
// all-gather. Losses and softmax gradients are then the whole vocabulary's; dx is this shard's
// term of the sum over the vocabulary, which the caller sums over the shards. Targets stay
// global ids; V the global real vocabulary. No M×V logits exist anywhere.
struct VocabShard {
  int v0 = 0;
  std::function<void(float* lse, float* target_logit, int rows)> combine;
};

// A quantized matrix's storage (model/quantize.h): int8 codes, value = scale·code; or NF4, two
// 4-bit codes a byte (element 2i in the low nibble), value = scale·kNf4Levels[code].
enum class QuantFormat { kInt8, kNf4 };
// NF4's levels (Dettmers et al. 2023, QLoRA, appendix E): the quantiles of N(0, 1) scaled to
// [-1, 1], with an exact zero.
inline constexpr float kNf4Levels[16] = {-1.0f,        -0.6961928f,  -0.52507305f, -0.39491749f,
                                         -0.28444138f, -0.18477343f, -0.09105004f, 0.0f,
                                         0.0795803f,   0.1609302f,   0.24611230f,  0.33791524f,
                                         0.44070983f,  0.562617f,    0.72295684f,  1.0f};

struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;  // e.g. the clipping factor
  int step = 1;
};

}  // namespace keel::kernels

// The arguments of kernel operations that every backend shares.
#pragma once

#include <cstdint>
#include <functional>

#include "keel/core/dtype.h"

// The mask hashes and DoraInverseNorm below run in CUDA kernels too (cuda/dropout.cu,
// cuda/dora.cu): one definition for both.
#if defined(__CUDACC__)
#define KEEL_HOST_DEVICE __host__ __device__
#else
#define KEEL_HOST_DEVICE
#endif

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

// DoRA's 1/‖W + s·B·A‖ for a row's norm n: 0 for a zero row (its scale then 0, not a NaN), and
// NaN for a NaN or infinite norm (n - n), so that a NaN or an infinity in W, A or B reaches the
// backward's dz of its column too (`n > 0 ? 1/n : 0` took NaN for a zero row, and 1/inf is 0).
// Used by every backend and by tensor parallelism's norms summed over shards
// (model/adapted_products.h).
KEEL_HOST_DEVICE inline float DoraInverseNorm(float n) {
  return n == 0.0f ? 0.0f : n - n == 0.0f ? 1.0f / n : n - n;
}

// LoRA dropout's mask (Backend::Dropout): element (r, c) of a block of a (rows, cols) matrix is
// kept when DropoutKeep(DropoutRowKey(key, row0 + r), col0 + c, threshold): a pure function of
// the key and the element's place in the whole matrix (row0: its first row's index among the
// step's global batch of tokens; col0: a tensor-parallel shard's first column), so the forward,
// its recompute and the backward, and every layout (data, tensor, pipeline parallel) draw the
// same mask. Kept elements are scaled by `scale` = 1 / (1 - p). Not Philox: a mask needs a
// uniform bit per element, not a statistical generator, and a 32-bit avalanche per element
// vectorizes in 32-bit lanes (Philox's ten rounds of 32x32->64-bit products per four draws do
// not, as simply): bench/lora_dropout_bench.
struct DropoutMask {
  uint64_t key = 0;
  uint64_t row0 = 0;
  uint32_t col0 = 0;
  uint32_t threshold = 0;  // keep when the element's 32 bits are >= this: p·2³²
  float scale = 1;
};

// Chris Wellons' lowbias32: a bijection of 32-bit words with near-ideal avalanche.
KEEL_HOST_DEVICE inline uint32_t Avalanche32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// SplitMix64's finalizer (Steele et al. 2014): mask keys from seeds, steps, products and rows.
KEEL_HOST_DEVICE inline uint64_t SplitMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Each row its own 32-bit key.
KEEL_HOST_DEVICE inline uint32_t DropoutRowKey(uint64_t key, uint64_t row) {
  return uint32_t(SplitMix64(key + (row + 1) * 0x9E3779B97F4A7C15ull) >> 32);
}

// Column c of the row whose key is `row_key`: a bijection of c for each row.
KEEL_HOST_DEVICE inline bool DropoutKeep(uint32_t row_key, uint32_t col, uint32_t threshold) {
  return Avalanche32(row_key ^ (col * 0x9E3779B9u)) >= threshold;
}

struct AdamWParams {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;  // e.g. the clipping factor
  int step = 1;
  // Stochastic rounding (bf16 moments, bf16 weights without a master): element i draws
  // RoundDraws(round_key, index0 + i), so that the draws are a pure function of the key and the
  // element's place in its tensor, whatever the sharding or thread count (AdamWState).
  uint64_t round_key = 0;
  uint64_t index0 = 0;
};

// What one AdamW update reads and writes. Moments in fp32 or bf16 (`bf16_moments`; bf16:
// stochastically rounded: with beta2 = 0.999, v moves 0.1% a step, under bf16's half ulp of
// 0.2%, and round-to-nearest would freeze it). `master` null: the bf16 `working` weights are the
// only copy and take the update stochastically rounded (llm.c's master-less mode); else the fp32
// master is updated and `working` (may be null) receives its round-to-nearest-even. Gradients in
// fp32 or bf16 (`bf16_grads`: optim.grad_dtype), widened exactly as they are read.
struct AdamWState {
  float* master = nullptr;
  bf16* working = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  bool bf16_moments = false;
  const void* grad = nullptr;
  bool bf16_grads = false;
};

// Three 16-bit uniform draws for element `index` (for m, v and the weight), from two 32-bit
// avalanches: cheap enough to vectorize beside AdamW's memory traffic.
struct RoundDraws {
  uint32_t m, v, w;
};
KEEL_HOST_DEVICE inline RoundDraws RoundDrawsOf(uint64_t key, uint64_t index) {
  const uint32_t a = Avalanche32(uint32_t(key) ^ (uint32_t(index) * 0x9E3779B9u) ^
                                 (uint32_t(index >> 32) * 0x85EBCA6Bu));
  const uint32_t b = Avalanche32(a ^ uint32_t(key >> 32));
  return {a & 0xffffu, a >> 16, b & 0xffffu};
}

}  // namespace keel::kernels

// A quantized frozen base (QLoRA, Dettmers et al. 2023): a LoRA run's block matrices stored as
// codes and scales (ModelConfig::lora_base), dequantized into the working dtype just before each
// product that reads them (Backend::Dequantize), forward and backward alike. The adapters, norms,
// embeddings and Llama's lm_head are not quantized.
//
// Formats, for a matrix (rows × cols) in fp32, symmetric (no zero point):
//   int8  one scale per row (output channel): s = max|w| / 127, code = round(w / s) in
//         [-127, 127]. Error: |w − s·code| ≤ s/2 = max|row| / 254 (0.39% of the row's largest).
//   nf4   one scale per 64 consecutive weights: s = max|w|, code = the nearest of the 16 NF4
//         levels to w / s (kernels::kNf4Levels). Error: |w − s·level| ≤ s · 0.13852 (half the
//         widest gap, between 0.72296 and 1); most weights of a normal block land nearer.
// Both round to nearest; a row or block of zeros gets scale 0 and dequantizes to zeros.
//
//   std::vector<uint8_t> codes(QuantCodeBytes(q, n));
//   std::vector<float> scales(n / QuantGroup(q, cols));
//   Quantize(q, w, rows, cols, codes.data(), scales.data());
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "keel/kernels/op_args.h"
#include "keel/model/config.h"

namespace keel::model {

struct ParamInfo;

// Weights per scale: a row of `cols` (int8), 64 (nf4).
size_t QuantGroup(BaseQuant q, size_t cols);
// Bytes of n codes: n (int8), n / 2 rounded up (nf4).
size_t QuantCodeBytes(BaseQuant q, size_t n);
// The code byte of element `i` of a quantized stream (nf4: i even).
inline size_t CodeByte(BaseQuant q, size_t i) { return q == BaseQuant::kNf4 ? i / 2 : i; }
kernels::QuantFormat FormatOf(BaseQuant q);
// The largest error the format allows for a weight of a group whose largest magnitude is `amax`.
double QuantErrorBound(BaseQuant q, double amax);

// Whether a layout with base `q` stores `p` quantized: the blocks' matrices (h.L.*, 2-D), not
// their adapters.
bool QuantizedParam(BaseQuant q, const ParamInfo& p);

// rows × cols fp32 values → codes (QuantCodeBytes(q, rows·cols) bytes) and scales
// (rows·cols / QuantGroup(q, cols)). nf4 needs rows·cols to be a multiple of 64. `group_amax`
// (one per scale; null: each group's own) is each group's largest magnitude where the group is
// wider than `w`: a tensor-parallel shard cut by columns holds part of each int8 row, whose scale
// is the whole row's (the max over the tp ranks of GroupAbsMax). A group holding a NaN or an
// infinity gets a NaN scale, whatever `group_amax` says: all of it dequantizes to NaN.
void Quantize(BaseQuant q, const float* w, size_t rows, size_t cols, uint8_t* codes, float* scales,
              const float* group_amax = nullptr);
// Why cfg's quantized base cannot be cut for tensor parallelism `tp`, or "": a shard must
// quantize the groups one process does. int8 always can (a row cut by columns takes the whole
// row's scale: TrainStep::SetWeights); nf4's rows on each rank must be whole groups of 64.
std::string TpQuantProblem(const ModelConfig& cfg, int tp);
// Each of Quantize's groups' largest magnitude (rows·cols / QuantGroup(q, cols) of them); NaN for
// a group holding a NaN or an infinity.
void GroupAbsMax(BaseQuant q, const float* w, size_t rows, size_t cols, float* amax);

}  // namespace keel::model

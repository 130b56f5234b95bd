// The weights a model reads (ParamAccess::Weights, Quantized) from the layout's fp32 values and
// back, in host memory: each tensor at its ParamInfo::work_offset in the working dtype (bf16:
// rounded to nearest even), a quantized base's matrices as codes and scales (quantize.h). What a
// LoRA run's frozen base is set from (train::TrainStep, DenseParams) and what its model file is
// read back from, so that both see the values the products computed with.
#pragma once

#include <cstdint>

#include "keel/core/dtype.h"
#include "keel/model/params.h"

namespace keel::model {

// Tensor p's values (p.numel floats at `x`) in the form the model reads: into `working` (its
// place in the working copy: p.numel elements of `dtype`), or, quantized, into `codes` and
// `scales` (its own: QuantCodeBytes and numel / QuantGroup of them). What WriteWorking does for
// each tensor, for callers that hold one tensor at a time. `group_amax`: Quantize's.
void WriteTensor(BaseQuant q, DType dtype, const ParamInfo& p, const float* x, void* working,
                 uint8_t* codes, float* scales, const float* group_amax = nullptr);
// `from`: layout.total() floats. `working`: layout.work_total() elements of `dtype`; `codes`,
// `scales`: the layout's quantized base (null when it has none).
void WriteWorking(const ParamLayout& layout, DType dtype, const float* from, void* working,
                  uint8_t* codes, float* scales);
// Every tensor's value as the products see it (a quantized one dequantized) into `to`
// (layout.total() floats). bf16 biases are whatever the working copy holds: callers that keep
// them in fp32 copy those over.
void ReadWorking(const ParamLayout& layout, DType dtype, const void* working, const uint8_t* codes,
                 const float* scales, float* to);
// Both at once, in place, a tensor at a time: `values` (layout.total() floats) become what a model
// set from them computes with (bf16-rounded, quantized and dequantized), biases included. What the
// checkpoint readers rebuild a LoRA run's base with.
void RoundTripWorking(const ParamLayout& layout, DType dtype, float* values);
// One quantized tensor `p` of a layout with base `q`: its p.numel `values` quantized and
// dequantized (into `dtype`, widened to fp32) in place.
void RoundTripQuantized(BaseQuant q, const ParamInfo& p, DType dtype, float* values);

}  // namespace keel::model

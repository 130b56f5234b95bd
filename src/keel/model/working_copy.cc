#include "keel/model/working_copy.h"

#include <algorithm>
#include <vector>

#include "keel/core/error.h"
#include "keel/kernels/backend.h"
#include "keel/model/quantize.h"

namespace keel::model {
namespace {

// A quantized tensor's values as the products see them, from its own codes and scales: dequantized
// into the working dtype (the kernels' own dequantization, on the CPU backend: host memory),
// widened to fp32.
void Dequantized(BaseQuant q, const ParamInfo& p, DType dtype, const uint8_t* codes,
                 const float* scales, float* y) {
  const size_t group = QuantGroup(q, size_t(p.shape[1]));
  if (dtype == DType::kF32)
    return kernels::Cpu().Dequantize(y, codes, scales, p.numel, group, FormatOf(q));
  auto widened = [&](auto zero) {
    std::vector<decltype(zero)> w(p.numel);
    kernels::Cpu().Dequantize(w.data(), codes, scales, p.numel, group, FormatOf(q));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < p.numel; ++i) y[i] = ToFloat(w[i]);
  };
  if (dtype == DType::kF16) return widened(f16{});
  KEEL_CHECK(dtype == DType::kBF16, "a quantized base computes in bf16, fp16 or fp32");
  widened(bf16{});
}

}  // namespace

void WriteTensor(BaseQuant q, DType dtype, const ParamInfo& p, const float* x, void* working,
                 uint8_t* codes, float* scales, const float* group_amax) {
  if (p.quantized())
    return Quantize(q, x, size_t(p.shape[0]), size_t(p.shape[1]), codes, scales, group_amax);
  if (dtype != DType::kF32) {
    ConvertFromF32(dtype, working, x, p.numel);
  } else {
    // host: the working copy is host memory here (working_copy.h)
    std::copy_n(x, p.numel, static_cast<float*>(working));
  }
}

void WriteWorking(const ParamLayout& layout, DType dtype, const float* from, void* working,
                  uint8_t* codes, float* scales) {
  const BaseQuant q = layout.base_quant();
  for (const ParamInfo& p : layout.params()) {
    if (p.quantized())
      WriteTensor(q, dtype, p, from + p.offset, nullptr, codes + CodeByte(q, p.quant_offset),
                  scales + p.scale_offset);
    else
      WriteTensor(q, dtype, p, from + p.offset,
                  static_cast<char*>(working) + p.work_offset * DTypeSize(dtype), nullptr, nullptr);
  }
}

void ReadWorking(const ParamLayout& layout, DType dtype, const void* working, const uint8_t* codes,
                 const float* scales, float* to) {
  for (const ParamInfo& p : layout.params()) {
    float* y = to + p.offset;
    if (p.quantized()) {
      Dequantized(layout.base_quant(), p, dtype,
                  codes + CodeByte(layout.base_quant(), p.quant_offset), scales + p.scale_offset,
                  y);
    } else if (dtype != DType::kF32) {
      ConvertToF32(dtype, y, static_cast<const char*>(working) + 2 * p.work_offset, p.numel);
    } else {
      // host: as above
      std::copy_n(static_cast<const float*>(working) + p.work_offset, p.numel, y);
    }
  }
}

void RoundTripQuantized(BaseQuant q, const ParamInfo& p, DType dtype, float* values) {
  std::vector<uint8_t> codes(QuantCodeBytes(q, p.numel));
  std::vector<float> scales(p.numel / QuantGroup(q, size_t(p.shape[1])));
  Quantize(q, values, size_t(p.shape[0]), size_t(p.shape[1]), codes.data(), scales.data());
  Dequantized(q, p, dtype, codes.data(), scales.data(), values);
}

void RoundTripWorking(const ParamLayout& layout, DType dtype, float* values) {
  for (const ParamInfo& p : layout.params()) {
    float* x = values + p.offset;
    if (p.quantized()) {
      RoundTripQuantized(layout.base_quant(), p, dtype, x);
    } else if (dtype == DType::kBF16 && p.bias_index == SIZE_MAX) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < p.numel; ++i) x[i] = ToFloat(ToBf16(x[i]));
    } else if (dtype == DType::kF16 && p.bias_index == SIZE_MAX) {
#pragma omp parallel for schedule(static)
      for (size_t i = 0; i < p.numel; ++i) x[i] = ToFloat(ToF16(x[i]));
    }
  }
}

}  // namespace keel::model

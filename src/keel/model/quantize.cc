#include "keel/model/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "keel/core/error.h"
#include "keel/model/params.h"

namespace keel::model {
namespace {

constexpr size_t kNf4Group = 64;

// The largest magnitude in w, or NaN where w holds a NaN or an infinity. Such a group is stored
// with a NaN scale, so that all of it dequantizes to NaN and the first loss shows it: std::max
// skips a NaN, which then took the lowest NF4 level (-amax) or int8 code 0 (an undefined
// conversion): a corrupted frozen weight no detector could see for the whole run.
float MaxAbs(const float* w, size_t n) {
  float m = 0;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(w[i]);
    m = std::max(m, a);
    finite &= a <= std::numeric_limits<float>::max();  // false for NaN and infinity
  }
  return finite ? m : std::numeric_limits<float>::quiet_NaN();
}

// A group's scale's amax: the group's own, or `shared` (a tensor-parallel row's, over every
// shard) unless the group's own is NaN, which an all-reduce's max may have dropped.
float GroupScaleMax(const float* w, size_t n, const float* shared) {
  const float own = MaxAbs(w, n);
  return shared && !std::isnan(own) ? *shared : own;
}

// The index of the NF4 level nearest x (x in [-1, 1]): the levels are sorted, so the first
// midpoint above x ends the search.
uint8_t Nf4Code(float x) {
  const float* lv = kernels::kNf4Levels;
  uint8_t c = 0;
  while (c < 15 && x > 0.5f * (lv[c] + lv[c + 1])) ++c;
  return c;
}

}  // namespace

size_t QuantGroup(BaseQuant q, size_t cols) { return q == BaseQuant::kNf4 ? kNf4Group : cols; }

size_t QuantCodeBytes(BaseQuant q, size_t n) {
  return q == BaseQuant::kNf4 ? (n + 1) / 2 : q == BaseQuant::kInt8 ? n : 0;
}

kernels::QuantFormat FormatOf(BaseQuant q) {
  KEEL_CHECK(q != BaseQuant::kNone, "FormatOf: the base is not quantized");
  return q == BaseQuant::kNf4 ? kernels::QuantFormat::kNf4 : kernels::QuantFormat::kInt8;
}

double QuantErrorBound(BaseQuant q, double amax) {
  if (q == BaseQuant::kInt8) return amax / 254.0;
  const float* lv = kernels::kNf4Levels;
  double gap = 0;
  for (int i = 0; i < 15; ++i) gap = std::max(gap, double(lv[i + 1]) - double(lv[i]));
  return amax * gap / 2;
}

bool QuantizedParam(BaseQuant q, const ParamInfo& p) {
  return q != BaseQuant::kNone && p.shape.size() == 2 && p.name.starts_with("h.") &&
         !IsLoraParam(p.name);
}

std::string TpQuantProblem(const ModelConfig& cfg, int tp) {
  if (cfg.lora_base != BaseQuant::kNf4 || tp <= 1) return "";
  const ParamLayout whole = ParamLayout::Whole(cfg);
  for (const ParamInfo& p : whole.params()) {
    if (!QuantizedParam(cfg.lora_base, p)) continue;
    const int cols = p.shape[1] / (TpAxis(cfg, p.name) == 1 ? tp : 1);
    if (cols % int(kNf4Group) != 0)
      return p.name + "'s rows are " + std::to_string(cols) + " weights on each of " +
             std::to_string(tp) + " tensor-parallel ranks, not whole groups of 64";
  }
  return "";
}

void GroupAbsMax(BaseQuant q, const float* w, size_t rows, size_t cols, float* amax) {
  const size_t group = QuantGroup(q, cols), n = rows * cols;
#pragma omp parallel for schedule(static)
  for (size_t g = 0; g < n / group; ++g) amax[g] = MaxAbs(w + g * group, group);
}

void Quantize(BaseQuant q, const float* w, size_t rows, size_t cols, uint8_t* codes, float* scales,
              const float* group_amax) {
  const size_t n = rows * cols;
  if (q == BaseQuant::kInt8) {
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; ++r) {
      const float* x = w + r * cols;
      const float s = GroupScaleMax(x, cols, group_amax ? group_amax + r : nullptr) / 127.0f;
      scales[r] = s;
      auto* c = reinterpret_cast<int8_t*>(codes) + r * cols;
      for (size_t i = 0; i < cols; ++i)
        c[i] = s > 0 ? int8_t(std::clamp(std::nearbyint(x[i] / s), -127.0f, 127.0f)) : 0;
    }
    return;
  }
  KEEL_CHECK(q == BaseQuant::kNf4 && n % kNf4Group == 0,
             "Quantize: nf4 needs a multiple of 64 weights (config validation)");
#pragma omp parallel for schedule(static)
  for (size_t g = 0; g < n / kNf4Group; ++g) {
    const float* x = w + g * kNf4Group;
    const float s = GroupScaleMax(x, kNf4Group, group_amax ? group_amax + g : nullptr);
    scales[g] = s;
    uint8_t* c = codes + g * kNf4Group / 2;
    for (size_t i = 0; i < kNf4Group; i += 2) {
      const uint8_t lo = s > 0 ? Nf4Code(x[i] / s) : 7, hi = s > 0 ? Nf4Code(x[i + 1] / s) : 7;
      c[i / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

}  // namespace keel::model

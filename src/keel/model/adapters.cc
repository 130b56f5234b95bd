// LoRA's and DoRA's adapter tensors beside the layout (params.h): which tensors they are, the
// merge into the base's weights, and DoRA's magnitudes at their start.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "keel/core/error.h"
#include "keel/model/params.h"
#include "keel/model/quantize.h"
#include "keel/model/working_copy.h"

namespace keel::model {

std::pair<int, int> LoraDims(const ModelConfig& cfg, LoraTarget t) {
  const int C = cfg.n_embd, q = cfg.n_head * cfg.head_size();
  switch (t) {
    case kLoraQkv:
      return {C, cfg.qkv_dim()};
    case kLoraProj:
      return {q, C};
    case kLoraFc:
      return {C, cfg.fc_dim()};
    case kLoraFcProj:
      return {cfg.ffn(), C};
  }
  return {0, 0};
}

bool IsLoraParam(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos ||
         IsDoraMagnitude(name);
}

bool IsDoraMagnitude(const std::string& name) { return name.ends_with(".lora_magnitude_vector"); }

void MergeLoraInPlace(const ModelConfig& cfg, std::vector<float>& whole) {
  if (cfg.lora_rank == 0) return;
  const ParamLayout lay = ParamLayout::Whole(cfg), base = ParamLayout::Whole(BaseModel(cfg));
  KEEL_CHECK(whole.size() == lay.total(), "MergeLoraInPlace: not the LoRA model's layout");
  const int r = cfg.lora_rank;
  const double s = cfg.lora_scale();
  for (int l = 0; l < cfg.n_layer; ++l)
    for (LoraTarget t : kLoraTargets) {
      if (!(cfg.lora_targets & t)) continue;
      const std::string h = "h." + std::to_string(l) + ".";
      const std::string m = h + LoraModule(cfg.llama(), t);
      const float* A = whole.data() + lay.Find(m + ".lora_A.weight").offset;
      const float* B = whole.data() + lay.Find(m + ".lora_B.weight").offset;
      float* W = whole.data() + lay.Find(h + LoraBaseWeight(cfg.llama(), t)).offset;
      const auto [in, n_out] = LoraDims(cfg, t);
      AddLowRank(W, B, A, n_out, in, r, s);
      if (!cfg.lora_dora) continue;
      // DoRA: each row of W + s·B·A to its magnitude.
      DoraRescaleRows(W, whole.data() + lay.Find(m + ".lora_magnitude_vector").offset, n_out, in);
    }
  // The base layout is this one without the adapters, in the same order: every tensor moves left
  // (or stays), so one forward pass of copies packs it in place.
  // host: whole-model weights in host memory, as inference and exports hold them.
  for (const ParamInfo& p : base.params()) {
    const float* from = whole.data() + lay.Find(p.name).offset;
    std::copy(from, from + p.numel, whole.data() + p.offset);
  }
  whole.resize(base.total());  // not shrunk: that would copy the model once more
}

std::vector<float> MergeLora(const ModelConfig& cfg, const float* whole) {
  std::vector<float> out(whole, whole + ParamLayout::Whole(cfg).total());
  MergeLoraInPlace(cfg, out);
  return out;
}

void AddLowRank(float* W, const float* B, const float* A, int out, int in, int r, double scale) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) {
      double acc = 0;
      for (int k = 0; k < r; ++k) acc += double(B[size_t(o) * r + k]) * A[size_t(k) * in + i];
      W[size_t(o) * in + i] = float(double(W[size_t(o) * in + i]) + scale * acc);
    }
}

namespace {

// norm[o] = ‖W[o]‖₂ of W (rows, cols), summed in fp64.
void RowNorms(const float* W, int rows, int cols, float* norm) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < rows; ++o) {
    double sq = 0;
    for (int i = 0; i < cols; ++i) sq += double(W[size_t(o) * cols + i]) * W[size_t(o) * cols + i];
    norm[o] = float(std::sqrt(sq));
  }
}

// DoRA's magnitude tensor `name`: its base weight's name and the product's (in, out).
struct DoraBase {
  std::string weight;
  int in, out;
};
DoraBase DoraBaseOf(const ModelConfig& cfg, const std::string& name) {
  const size_t dot = name.find('.', 2);  // "h.L."
  const std::string h = name.substr(0, dot + 1);
  for (LoraTarget t : kLoraTargets)
    if (name == h + LoraModule(cfg.llama(), t) + ".lora_magnitude_vector") {
      const auto [in, out] = LoraDims(cfg, t);
      return {h + LoraBaseWeight(cfg.llama(), t), in, out};
    }
  ThrowRuntime("\"" + name + "\" is no DoRA magnitude of this model");
}

}  // namespace

void DoraRescaleRows(float* W, const float* magnitude, int out, int in) {
  std::vector<float> norm(static_cast<size_t>(out));
  RowNorms(W, out, in, norm.data());
  for (int o = 0; o < out; ++o) {
    const double g = norm[size_t(o)] > 0 ? double(magnitude[o]) / norm[size_t(o)] : 0.0;
    for (int i = 0; i < in; ++i) W[size_t(o) * in + i] = float(g * W[size_t(o) * in + i]);
  }
}

namespace {

// The base rows [w0, w0 + n) of `lay` in `rows` as the products compute with them: quantized and
// dequantized where the base is (fp32), so that a fresh adapter's scales are 1 there too.
void AsComputed(const ModelConfig& cfg, const ParamLayout& lay, size_t w0, size_t n, float* rows) {
  if (cfg.lora_base == BaseQuant::kNone) return;
  for (const ParamInfo& q : lay.params())
    if (q.quantized() && q.offset >= w0 && q.offset < w0 + n)
      RoundTripQuantized(cfg.lora_base, q, DType::kF32, rows + (q.offset - w0));
}

}  // namespace

void InitDoraMagnitudes(const ModelConfig& cfg, float* whole) {
  if (!cfg.lora_dora) return;
  const ParamLayout lay = ParamLayout::Whole(cfg);
  for (const ParamInfo& p : lay.params()) {
    if (!IsDoraMagnitude(p.name)) continue;
    const DoraBase b = DoraBaseOf(cfg, p.name);
    const size_t w0 = lay.Find(b.weight).offset, n = size_t(b.out) * size_t(b.in);
    std::vector<float> rows(whole + w0, whole + w0 + n);
    AsComputed(cfg, lay, w0, n, rows.data());
    RowNorms(rows.data(), b.out, b.in, whole + p.offset);
  }
}

void InitDoraMagnitude(const ParamInfo& p, const ModelConfig& cfg, uint64_t seed, float* w,
                       TpShard tp) {
  // The base's initial rows drawn again here, whole, as InitParams would have them.
  DoraMagnitudeFrom(
      p, cfg, [&](const ParamInfo& q, float* out) { InitTensor(q, cfg, seed, out); }, w, tp);
}

void DoraMagnitudeFrom(const ParamInfo& p, const ModelConfig& cfg,
                       const std::function<void(const ParamInfo& q, float* out)>& fill, float* w,
                       TpShard tp) {
  // The norms of the base's rows: its tensors (a fused product spans several) whole; then this
  // shard's.
  const DoraBase b = DoraBaseOf(cfg, p.name);
  const ParamLayout lay = ParamLayout::Whole(cfg);
  const size_t w0 = lay.Find(b.weight).offset, n = size_t(b.out) * size_t(b.in);
  std::vector<float> base(n), norms(static_cast<size_t>(b.out));
  for (const ParamInfo& q : lay.params())
    if (q.offset >= w0 && q.offset < w0 + n) fill(q, base.data() + (q.offset - w0));
  AsComputed(cfg, lay, w0, n, base.data());
  RowNorms(base.data(), b.out, b.in, norms.data());
  ForEachShardRun(p, tp.size, tp.rank, [&](size_t local, size_t global, size_t k) {
    // host: initial values, drawn in host memory as every tensor's are
    std::copy_n(norms.data() + global, k, w + local);
  });
}

}  // namespace keel::model

// LoRA adapters (model/config.h) in both families, on all four products of a block:
//  - with B = 0 (their start) the model is exactly the base model;
//  - the adapted model is the base model with merged weights W + s·B·A (MergeLora): logits agree;
//  - the adapters' gradients are the chain rule through the merged weight: with G = ∂L/∂W' of the
//    merged model, ∂L/∂B = s·G·Aᵀ and ∂L/∂A = s·Bᵀ·G;
//  - a frozen base computes no weight gradients (they stay zero) and leaves the adapters' alone;
//  - with dropout, the adapters' gradients are the central differences of the loss under the same
//    mask, full recompute draws that mask again (bitwise the same step), evaluation and a pass
//    without a key apply none, and another step's key another mask;
//  - DoRA: fresh magnitudes (the base's row norms, drawn alike by InitParams and InitTensor; a
//    quantized base's as the products see them) give the base model; trained ones the merged model
//    g ⊙ (W + s·B·A), g = m / ‖W + s·B·A‖ per row, and the chain rule through it with the norm held
//    constant: with G = ∂L/∂W', ∂L/∂B = s·(g ⊙ G)·Aᵀ, ∂L/∂A = s·Bᵀ·(g ⊙ G), ∂L/∂m = Σᵢ G·(W +
//    s·B·A) / ‖W + s·B·A‖; recompute "attn" and "full" give the same step bit for bit; under
//    dropout, PEFT's form (checked as the dropout test says).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "keel/core/rng.h"
#include "keel/model/config.h"
#include "keel/model/params.h"
#include "keel/model/transformer.h"
#include "model/lora_weights.h"

namespace keel::model {
namespace {

constexpr int kB = 2, kT = 16;

ModelConfig WithLora(ModelConfig c) {
  c.lora_rank = 3;
  c.lora_alpha = 5;
  c.lora_targets = kLoraQkv | kLoraProj | kLoraFc | kLoraFcProj;
  return c;
}

std::vector<ModelConfig> Configs() {
  return {WithLora({2, 2, 32, 50257, 64}), WithLora(NamedConfig("llama-tiny"))};
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};
Batch MakeBatch() {
  Batch b;
  const Philox rng(3, 1);
  for (int i = 0; i < kB * kT; ++i) {
    b.tokens.push_back(int32_t(rng.Bits(uint64_t(2 * i))[0] % 50000));
    b.targets.push_back(int32_t(rng.Bits(uint64_t(2 * i + 1))[0] % 50000));
  }
  return b;
}

struct Result {
  double loss = 0;
  std::vector<float> grads, logits;
};

Result Step(const ModelConfig& cfg, const std::vector<float>& w, const std::vector<bool>& frozen,
            Recompute rc = Recompute::kNone) {
  Transformer m(cfg, DType::kF32, kB, kT, rc);
  std::copy(w.begin(), w.end(), m.master());
  m.SyncWorking();
  if (!frozen.empty()) m.SetFrozen(frozen);
  const Batch b = MakeBatch();
  m.ZeroGrads();
  Result r;
  r.loss = m.ForwardBackward(b.tokens.data(), b.targets.data(), 1.0f / (kB * kT));
  r.grads.assign(m.grads(), m.grads() + m.layout().grad_total());
  r.logits.resize(size_t(kB) * kT * size_t(cfg.vocab_size));
  m.ForwardLogits(b.tokens.data(), r.logits.data());
  return r;
}

double MaxRel(const float* a, const double* b, size_t n) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(b[i]));
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  return scale > 0 ? worst / scale : worst;
}

TEST(Lora, ZeroBIsTheBaseModel) {
  for (const ModelConfig& cfg : Configs()) {
    SCOPED_TRACE(FamilyName(cfg.family));
    const ParamLayout lay = ParamLayout::Whole(cfg);
    std::vector<float> w(lay.total());
    InitParams(lay, cfg, 11, w.data());  // B starts at zero
    const Result lora = Step(cfg, w, {});
    const Result base = Step(BaseModel(cfg), MergeLora(cfg, w.data()), {});
    EXPECT_EQ(lora.loss, base.loss);
    EXPECT_TRUE(lora.logits == base.logits);
  }
}

TEST(Lora, AdaptedModelIsTheMergedModelAndItsGradientsFollowTheChainRule) {
  for (const ModelConfig& cfg : Configs()) {
    SCOPED_TRACE(FamilyName(cfg.family));
    const std::vector<float> w = test::RandomLoraWeights(cfg);
    const Result lora = Step(cfg, w, {});
    const ModelConfig base_cfg = BaseModel(cfg);
    const Result merged = Step(base_cfg, MergeLora(cfg, w.data()), {});
    EXPECT_NEAR(lora.loss, merged.loss, 1e-5 * std::fabs(merged.loss));
    std::vector<double> want(merged.logits.begin(), merged.logits.end());
    EXPECT_LE(MaxRel(lora.logits.data(), want.data(), want.size()), 1e-5);

    const ParamLayout lay = ParamLayout::Whole(cfg), base = ParamLayout::Whole(base_cfg);
    const double s = cfg.lora_scale();
    const int r = cfg.lora_rank;
    for (int l = 0; l < cfg.n_layer; ++l)
      for (int k = 0; k < 4; ++k) {
        const LoraTarget t = kLoraTargets[k];
        const std::string h = "h." + std::to_string(l) + ".";
        const std::string mod = h + LoraModule(cfg.llama(), t);
        SCOPED_TRACE(mod);
        const auto [in, out] = LoraDims(cfg, t);
        const float* A = w.data() + lay.Find(mod + ".lora_A.weight").offset;
        const float* B = w.data() + lay.Find(mod + ".lora_B.weight").offset;
        const float* G =
            merged.grads.data() + base.Find(h + LoraBaseWeight(cfg.llama(), t)).grad_offset;
        std::vector<double> dA(size_t(r) * in, 0.0), dB(size_t(out) * r, 0.0);
        for (int o = 0; o < out; ++o)
          for (int i = 0; i < in; ++i) {
            const double g = G[size_t(o) * in + i];
            for (int j = 0; j < r; ++j) {
              dB[size_t(o) * r + j] += s * g * A[size_t(j) * in + i];
              dA[size_t(j) * in + i] += s * B[size_t(o) * r + j] * g;
            }
          }
        // A LoRA layout's gradients are the adapters', packed (ParamLayout::grad_offset).
        EXPECT_LE(MaxRel(lora.grads.data() + lay.Find(mod + ".lora_A.weight").grad_offset,
                         dA.data(), dA.size()),
                  1e-4);
        EXPECT_LE(MaxRel(lora.grads.data() + lay.Find(mod + ".lora_B.weight").grad_offset,
                         dB.data(), dB.size()),
                  1e-4);
      }
  }
}

ModelConfig WithDora(ModelConfig c) {
  c.lora_dora = true;
  return c;
}

// Block l's product `t` of a LoRA layout's weights `w`: V = W + s·B·A (out, in) in fp64.
std::vector<double> Adapted(const ModelConfig& cfg, const std::vector<float>& w, int l,
                            LoraTarget t) {
  const ParamLayout lay = ParamLayout::Whole(cfg);
  const std::string h = "h." + std::to_string(l) + ".", mod = h + LoraModule(cfg.llama(), t);
  const auto [in, out] = LoraDims(cfg, t);
  const int r = cfg.lora_rank;
  const float* W = w.data() + lay.Find(h + LoraBaseWeight(cfg.llama(), t)).offset;
  const float* A = w.data() + lay.Find(mod + ".lora_A.weight").offset;
  const float* B = w.data() + lay.Find(mod + ".lora_B.weight").offset;
  std::vector<double> V(size_t(out) * in);
  for (int o = 0; o < out; ++o)
    for (int i = 0; i < in; ++i) {
      double acc = 0;
      for (int j = 0; j < r; ++j) acc += double(B[size_t(o) * r + j]) * A[size_t(j) * in + i];
      V[size_t(o) * in + i] = W[size_t(o) * in + i] + cfg.lora_scale() * acc;
    }
  return V;
}

std::vector<double> Norms(const std::vector<double>& V, int out, int in) {
  std::vector<double> n(static_cast<size_t>(out));
  for (int o = 0; o < out; ++o) {
    double sq = 0;
    for (int i = 0; i < in; ++i) sq += V[size_t(o) * in + i] * V[size_t(o) * in + i];
    n[size_t(o)] = std::sqrt(sq);
  }
  return n;
}

// Random adapters (lora_weights.h), and each magnitude ‖W + s·B·A‖ off by up to ±20%, so that
// the rescaling counts.
std::vector<float> RandomDoraWeights(const ModelConfig& cfg) {
  std::vector<float> w = test::RandomLoraWeights(cfg);
  const ParamLayout lay = ParamLayout::Whole(cfg);
  const Philox rng(13, 0);
  for (int l = 0; l < cfg.n_layer; ++l)
    for (LoraTarget t : kLoraTargets) {
      const auto [in, out] = LoraDims(cfg, t);
      const std::vector<double> n = Norms(Adapted(cfg, w, l, t), out, in);
      float* m = w.data() + lay.Find("h." + std::to_string(l) + "." + LoraModule(cfg.llama(), t) +
                                     ".lora_magnitude_vector")
                                .offset;
      for (int o = 0; o < out; ++o)
        m[o] = float(n[size_t(o)] *
                     (1.0 + 0.2 * (int(rng.Bits(size_t(o))[0] % 2001) - 1000) / 1000.0));
    }
  return w;
}

struct DropoutRun {
  std::unique_ptr<Transformer> m;
  Batch b = MakeBatch();
  double Loss(uint64_t key, bool train = true) {  // Σ row losses; the gradients accumulate
    m->ClearDropout();
    if (train) m->SetDropout(0, key, 0);
    m->ZeroGrads();
    return m->ForwardBackward(b.tokens.data(), b.targets.data(), 1.0f);
  }
};

DropoutRun MakeDropoutRun(const ModelConfig& cfg, Recompute rc) {
  DropoutRun r{std::make_unique<Transformer>(cfg, DType::kF32, kB, kT, rc)};
  const std::vector<float> w =
      cfg.lora_dora ? RandomDoraWeights(cfg) : test::RandomLoraWeights(cfg);
  std::copy(w.begin(), w.end(), r.m->master());
  r.m->SyncWorking();
  return r;
}

// The gradients `g` of `run` under `key` against the loss's central differences, at the
// largest-gradient element of each tensor `pick` names.
void ExpectCentralDifferences(DropoutRun& run, const std::vector<float>& g, uint64_t key,
                              bool (*pick)(const std::string&)) {
  for (const ParamInfo& p : run.m->layout().params()) {
    if (!pick(p.name)) continue;
    size_t at = 0;
    for (size_t i = 0; i < p.numel; ++i)
      if (std::fabs(g[p.grad_offset + i]) > std::fabs(g[p.grad_offset + at])) at = i;
    float& w = run.m->master()[p.offset + at];
    const float w0 = w, eps = 1e-2f;
    w = w0 + eps;
    const double up = run.Loss(key);
    w = w0 - eps;
    const double down = run.Loss(key);
    w = w0;
    const double fd = (up - down) / (2.0 * double(eps)), got = g[p.grad_offset + at];
    EXPECT_NEAR(got, fd, 0.02 * std::fabs(fd) + 2e-3) << p.name << "[" << at << "]";
  }
}

// DoRA under dropout takes PEFT's form (transformer_impl.h's DoraMasked): its A and B get the
// gradient of a norm held constant, which no difference of losses gives, so the differences
// check its magnitudes (on which the norm does not depend), and a mask that drops nothing (p =
// 1e-9: scale 1) must compute what the unmasked path does, its gradients within 1e-5, through
// the masked path's other products.
TEST(Lora, DropoutGradientsAreTheLossesDifferencesUnderTheSameMask) {
  for (const ModelConfig& lora : Configs())
    for (bool dora : {false, true}) {
      ModelConfig cfg = dora ? WithDora(lora) : lora;
      SCOPED_TRACE(std::string(FamilyName(cfg.family)) + (dora ? " DoRA" : ""));
      cfg.lora_dropout = 0.3f;
      DropoutRun run = MakeDropoutRun(cfg, Recompute::kNone);
      const uint64_t key = 5;
      const double loss = run.Loss(key);
      const std::vector<float> g(run.m->grads(), run.m->grads() + run.m->layout().grad_total());
      // Full recompute draws the same masks again: the same step, bit for bit.
      DropoutRun again = MakeDropoutRun(cfg, Recompute::kFull);
      EXPECT_EQ(again.Loss(key), loss);
      EXPECT_TRUE(std::equal(g.begin(), g.end(), again.m->grads()));
      // No key (evaluation) is the model without dropout; another key another mask.
      ModelConfig plain = cfg;
      plain.lora_dropout = 0;
      DropoutRun none = MakeDropoutRun(plain, Recompute::kNone);
      const double undropped = none.Loss(0, false);
      const std::vector<float> g0(none.m->grads(), none.m->grads() + none.m->layout().grad_total());
      EXPECT_EQ(run.Loss(key, false), undropped);
      EXPECT_EQ(run.m->Forward(run.b.tokens.data(), run.b.targets.data()), undropped);
      EXPECT_NE(loss, undropped);
      EXPECT_NE(run.Loss(key + 1), loss);
      // Central differences at each adapter's largest-gradient element: layer 0's gradients
      // reach it through layer 1's masked products too.
      ExpectCentralDifferences(run, g, key, dora ? IsDoraMagnitude : IsLoraParam);
      if (!dora) continue;
      ModelConfig keep_all = cfg;
      keep_all.lora_dropout = 1e-9f;
      DropoutRun kept = MakeDropoutRun(keep_all, Recompute::kNone);
      EXPECT_NEAR(kept.Loss(key), undropped, 1e-6 * std::fabs(undropped));
      std::vector<double> want(g0.begin(), g0.end());
      EXPECT_LE(MaxRel(kept.m->grads(), want.data(), want.size()), 1e-5);
    }
}

TEST(Dora, FreshMagnitudesAreTheBaseRowNormsAndTheBaseModel) {
  for (const ModelConfig& lora : Configs()) {
    const ModelConfig cfg = WithDora(lora);
    SCOPED_TRACE(FamilyName(cfg.family));
    const ParamLayout lay = ParamLayout::Whole(cfg);
    std::vector<float> w(lay.total());
    InitParams(lay, cfg, 11, w.data());
    for (int l = 0; l < cfg.n_layer; ++l)
      for (LoraTarget t : kLoraTargets) {
        const auto [in, out] = LoraDims(cfg, t);
        const std::vector<double> n = Norms(Adapted(cfg, w, l, t), out, in);  // B = 0: ‖W‖
        const ParamInfo& p = lay.Find("h." + std::to_string(l) + "." + LoraModule(cfg.llama(), t) +
                                      ".lora_magnitude_vector");
        std::vector<float> drawn(p.numel);  // a tensor at a time, as a LoRA run from random weights
        InitTensor(p, cfg, 11, drawn.data());
        EXPECT_TRUE(std::equal(drawn.begin(), drawn.end(), w.data() + p.offset)) << p.name;
        for (int o = 0; o < out; ++o)
          EXPECT_NEAR(w[p.offset + size_t(o)], n[size_t(o)], 1e-6 * n[size_t(o)]) << p.name;
      }
    const Result dora = Step(cfg, w, {});
    const Result base = Step(BaseModel(cfg), MergeLora(cfg, w.data()), {});
    EXPECT_NEAR(dora.loss, base.loss, 1e-6 * std::fabs(base.loss));
    std::vector<double> want(base.logits.begin(), base.logits.end());
    EXPECT_LE(MaxRel(dora.logits.data(), want.data(), want.size()), 1e-6);
    // On an int8 base the magnitudes are the norms of the rows the products see (quantized and
    // dequantized): a fresh DoRA model is the LoRA model of the same quantized base.
    ModelConfig q = cfg, q_lora = lora;
    q.lora_base = q_lora.lora_base = BaseQuant::kInt8;
    const ParamLayout qlay = ParamLayout::Whole(q), lora_lay = ParamLayout::Whole(q_lora);
    std::vector<float> qw(qlay.total()), lw(lora_lay.total());
    InitParams(qlay, q, 11, qw.data());
    for (const ParamInfo& p : lora_lay.params())
      std::copy_n(qw.data() + qlay.Find(p.name).offset, p.numel, lw.data() + p.offset);
    const Result qdora = Step(q, qw, {}), qbase = Step(q_lora, lw, {});
    EXPECT_NEAR(qdora.loss, qbase.loss, 1e-6 * std::fabs(qbase.loss));
  }
}

TEST(Dora, AdaptedModelIsTheMergedModelAndItsGradientsFollowTheChainRule) {
  for (const ModelConfig& lora : Configs()) {
    const ModelConfig cfg = WithDora(lora);
    SCOPED_TRACE(FamilyName(cfg.family));
    const std::vector<float> w = RandomDoraWeights(cfg);
    const Result dora = Step(cfg, w, {});
    const ModelConfig base_cfg = BaseModel(cfg);
    const Result merged = Step(base_cfg, MergeLora(cfg, w.data()), {});
    EXPECT_NEAR(dora.loss, merged.loss, 1e-5 * std::fabs(merged.loss));
    std::vector<double> want(merged.logits.begin(), merged.logits.end());
    EXPECT_LE(MaxRel(dora.logits.data(), want.data(), want.size()), 1e-5);
    for (Recompute rc : {Recompute::kAttn, Recompute::kFull}) {
      const Result again = Step(cfg, w, {}, rc);
      EXPECT_EQ(again.loss, dora.loss) << RecomputeName(rc);
      EXPECT_TRUE(again.grads == dora.grads) << RecomputeName(rc);
    }

    const ParamLayout lay = ParamLayout::Whole(cfg), base = ParamLayout::Whole(base_cfg);
    const double s = cfg.lora_scale();
    const int r = cfg.lora_rank;
    for (int l = 0; l < cfg.n_layer; ++l)
      for (LoraTarget t : kLoraTargets) {
        const std::string h = "h." + std::to_string(l) + ".";
        const std::string mod = h + LoraModule(cfg.llama(), t);
        SCOPED_TRACE(mod);
        const auto [in, out] = LoraDims(cfg, t);
        const std::vector<double> V = Adapted(cfg, w, l, t);
        const std::vector<double> n = Norms(V, out, in);
        const float* A = w.data() + lay.Find(mod + ".lora_A.weight").offset;
        const float* B = w.data() + lay.Find(mod + ".lora_B.weight").offset;
        const float* m = w.data() + lay.Find(mod + ".lora_magnitude_vector").offset;
        const float* G =
            merged.grads.data() + base.Find(h + LoraBaseWeight(cfg.llama(), t)).grad_offset;
        std::vector<double> dA(size_t(r) * in, 0.0), dB(size_t(out) * r, 0.0), dm(size_t(out), 0.0);
        for (int o = 0; o < out; ++o) {
          const double g = m[o] / n[size_t(o)];
          for (int i = 0; i < in; ++i) {
            const double go = g * G[size_t(o) * in + i];
            dm[size_t(o)] += G[size_t(o) * in + i] * V[size_t(o) * in + i] / n[size_t(o)];
            for (int j = 0; j < r; ++j) {
              dB[size_t(o) * r + j] += s * go * A[size_t(j) * in + i];
              dA[size_t(j) * in + i] += s * B[size_t(o) * r + j] * go;
            }
          }
        }
        auto grad = [&](const char* n) {
          return dora.grads.data() + lay.Find(mod + n).grad_offset;
        };
        EXPECT_LE(MaxRel(grad(".lora_A.weight"), dA.data(), dA.size()), 1e-4);
        EXPECT_LE(MaxRel(grad(".lora_B.weight"), dB.data(), dB.size()), 1e-4);
        EXPECT_LE(MaxRel(grad(".lora_magnitude_vector"), dm.data(), dm.size()), 1e-4);
      }
  }
}

// A LoRA layout's gradient buffer holds the adapters' gradients alone, packed in layout order
// (each segment's from segment_grad_start), then the scratch the frozen norms' kernels write to;
// every other frozen tensor has none, so no weight-gradient product runs for it. A layout without
// adapters keeps every gradient at its weight's offset.
TEST(Lora, TheGradientBufferHoldsTheAdaptersAlone) {
  for (const ModelConfig& cfg : Configs()) {
    SCOPED_TRACE(FamilyName(cfg.family));
    const ParamLayout lay = ParamLayout::Whole(cfg);
    size_t at = 0;
    for (const ParamInfo& p : lay.params()) {
      if (IsLoraParam(p.name)) {
        EXPECT_EQ(p.grad_offset, at) << p.name;
        at += p.numel;
      } else if (NormParam(p)) {
        EXPECT_GE(p.grad_offset, lay.grad_trained()) << p.name;
        EXPECT_LE(p.grad_offset + p.numel, lay.grad_total()) << p.name;
      } else {
        EXPECT_EQ(p.grad_offset, SIZE_MAX) << p.name;
      }
    }
    EXPECT_EQ(lay.grad_trained(), at);
    EXPECT_EQ(lay.grad_total(), at + 2 * size_t(cfg.n_embd));
    for (int s = 0; s < lay.segments(); ++s)
      for (const ParamInfo& p : lay.params())
        if (IsLoraParam(p.name) && p.offset >= lay.segment_start(s) &&
            p.offset < lay.segment_end(s)) {
          EXPECT_EQ(lay.segment_grad_start(s), p.grad_offset) << "segment " << s;
          break;
        }
    const ParamLayout base = ParamLayout::Whole(BaseModel(cfg));
    EXPECT_EQ(base.grad_total(), base.total());
    for (const ParamInfo& p : base.params()) EXPECT_EQ(p.grad_offset, p.offset) << p.name;
  }
}

}  // namespace
}  // namespace keel::model

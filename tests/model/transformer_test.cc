// Whole-model tests that need no oracle: the loss at initialization, recomputation changing
// nothing, bitwise repeatability, and parameter/activation accounting. The PyTorch oracle
// (tests/reference) checks the numbers themselves.
#include "keel/model/transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "keel/core/error.h"
#include "keel/core/rng.h"
#include "keel/model/params.h"

namespace keel::model {
namespace {

ModelConfig Tiny() { return {2, 2, 32, 50257, 64}; }

struct Batch {
  std::vector<int32_t> tokens, targets;
};

Batch RandomBatch(int B, int T, int V, uint64_t seed) {
  Philox rng(seed, 0);
  Batch b;
  for (int i = 0; i < B * T; ++i) {
    b.tokens.push_back(int32_t(rng.Bits(2 * i)[0] % V));
    b.targets.push_back(int32_t(rng.Bits(2 * i + 1)[0] % V));
  }
  return b;
}

std::vector<float> RunGrads(DType dtype, Recompute rc, double* loss,
                            const ModelConfig& cfg = Tiny()) {
  const int B = 2, T = 16;
  Transformer m(cfg, dtype, B, T, rc);
  InitParams(m.layout(), m.config(), 7, m.master());
  m.SyncWorking();
  Batch b = RandomBatch(B, T, 50257, 3);
  m.ZeroGrads();
  *loss = m.ForwardBackward(b.tokens.data(), b.targets.data(), 1.0f / (B * T));
  return std::vector<float>(m.grads(), m.grads() + m.layout().total());
}

TEST(Gpt, InitialLossIsNearLogVocab) {
  double loss;
  RunGrads(DType::kF32, Recompute::kNone, &loss);
  EXPECT_NEAR(loss / 32, std::log(50257.0), 0.1);
}

TEST(Gpt, RecomputeGivesBitwiseIdenticalGradients) {
  for (const ModelConfig& cfg : {Tiny(), NamedConfig("llama-tiny")})
    for (DType d : {DType::kF32, DType::kBF16}) {
      double l0, l1, l2;
      auto g0 = RunGrads(d, Recompute::kNone, &l0, cfg);
      auto g1 = RunGrads(d, Recompute::kAttn, &l1, cfg);
      auto g2 = RunGrads(d, Recompute::kFull, &l2, cfg);
      EXPECT_EQ(l0, l1) << FamilyName(cfg.family);
      EXPECT_EQ(l0, l2) << FamilyName(cfg.family);
      EXPECT_TRUE(g0 == g1) << FamilyName(cfg.family) << " " << DTypeName(d);
      EXPECT_TRUE(g0 == g2) << FamilyName(cfg.family) << " " << DTypeName(d);
    }
}

TEST(Gpt, RepeatedStepsAreBitwiseIdentical) {
  double a, b;
  EXPECT_TRUE(RunGrads(DType::kBF16, Recompute::kNone, &a) ==
              RunGrads(DType::kBF16, Recompute::kNone, &b));
  EXPECT_EQ(a, b);
}

TEST(Gpt, ForwardMatchesForwardBackwardLoss) {
  const int B = 2, T = 16;
  Transformer m(Tiny(), DType::kF32, B, T, Recompute::kNone);
  InitParams(m.layout(), m.config(), 7, m.master());
  Batch b = RandomBatch(B, T, 50257, 3);
  double fwd = m.Forward(b.tokens.data(), b.targets.data());
  double fb = m.ForwardBackward(b.tokens.data(), b.targets.data(), 1.0f);
  EXPECT_EQ(fwd, fb);
}

// A ParamAccess that holds every segment and records what the model says, in order.
class RecordingAccess final : public ParamAccess {
 public:
  explicit RecordingAccess(const ParamLayout& l) : l_(l), w_(l.total()), g_(l.total(), 0.0f) {}
  const void* Weights(int s) override { return w_.data() + l_.segment_start(s); }
  const float* Biases() override { return nullptr; }
  float* Grads(int s) override { return g_.data() + l_.segment_start(s); }
  void Use(int s, Pass p) override {
    log.push_back((p == Pass::kForward ? "F" : "B") + std::to_string(s));
  }
  void GradsDone(int s) override { log.push_back("G" + std::to_string(s)); }
  std::vector<float>& weights() { return w_; }
  std::vector<float>& grads() { return g_; }
  std::vector<std::string> log;

 private:
  const ParamLayout& l_;
  std::vector<float> w_, g_;
};

TEST(Gpt, ParamAccessSeesSegmentsInOrderAndGivesTheSameGradients) {
  const int B = 1, T = 8;
  Transformer dense(Tiny(), DType::kF32, B, T, Recompute::kNone);
  InitParams(dense.layout(), dense.config(), 1, dense.master());
  RecordingAccess acc(dense.layout());
  Transformer m(Tiny(), DType::kF32, B, T, Recompute::kNone, &acc);
  std::copy_n(dense.master(), dense.layout().total(), acc.weights().data());
  Batch b = RandomBatch(B, T, 50257, 5);
  dense.ZeroGrads();
  const double l1 = dense.ForwardBackward(b.tokens.data(), b.targets.data(), 1.0f);
  const double l2 = m.ForwardBackward(b.tokens.data(), b.targets.data(), 1.0f);
  EXPECT_EQ(l1, l2);
  for (size_t i = 0; i < dense.layout().total(); ++i)
    ASSERT_EQ(dense.grads()[i], acc.grads()[i]) << "element " << i;
  // Two layers: segments 0 (embeddings), 1, 2 (blocks), 3 (ln_f); gradients final in reverse.
  const std::vector<std::string> want = {"F0", "F1", "F2", "F3", "G3",
                                         "B2", "G2", "B1", "G1", "G0"};
  EXPECT_EQ(acc.log, want);
  EXPECT_THROW(m.master(), keel::Error);  // the access holds them
}

TEST(Gpt, Gpt2SmallHas124MParameters) {
  auto layout = ParamLayout::Whole(NamedConfig("gpt2"));
  // 124,439,808 with the real vocabulary; padding to 50304 rows adds 47·768.
  EXPECT_EQ(layout.total(), 124439808u + 47u * 768u);
  auto xl = ParamLayout::Whole(NamedConfig("gpt2-xl"));
  EXPECT_NEAR(double(xl.total()), 1.558e9, 0.002e9);
}

// The published sizes: TinyLlama-1.1B 1,100,048,384 and Meta-Llama-3-8B 8,030,261,248 (their
// vocabularies, 32000 and 128256, are multiples of 128: no padding).
TEST(Gpt, LlamaShapesHaveTheirPublishedParameterCounts) {
  EXPECT_EQ(ParamLayout::Whole(NamedConfig("tinyllama-1.1b")).total(), 1100048384u);
  EXPECT_EQ(ParamLayout::Whole(NamedConfig("llama3-8b")).total(), 8030261248u);
}

TEST(Gpt, RecomputationShrinksTheActivationArena) {
  auto cfg = NamedConfig("gpt2");
  size_t none = PlanActivations(cfg, 4, 256, DType::kBF16, Recompute::kNone).total_bytes;
  size_t attn = PlanActivations(cfg, 4, 256, DType::kBF16, Recompute::kAttn).total_bytes;
  size_t full = PlanActivations(cfg, 4, 256, DType::kBF16, Recompute::kFull).total_bytes;
  EXPECT_LT(attn, none);
  EXPECT_LT(full, attn);
  Transformer m(cfg, DType::kBF16, 4, 256, Recompute::kFull);
  EXPECT_EQ(m.activation_plan().total_bytes, full);
}

TEST(Gpt, InitIsAFunctionOfTheSeedOnly) {
  auto cfg = Tiny();
  auto layout = ParamLayout::Whole(cfg);
  std::vector<float> a(layout.total()), b(layout.total()), c(layout.total());
  InitParams(layout, cfg, 11, a.data());
  InitParams(layout, cfg, 11, b.data());
  InitParams(layout, cfg, 12, c.data());
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == c);
  // Padded vocabulary rows start at zero.
  const auto& wte = layout.Find("wte.weight");
  for (size_t i = size_t(cfg.vocab_size) * cfg.n_embd; i < wte.numel; ++i)
    ASSERT_EQ(a[wte.offset + i], 0.0f);
}

}  // namespace
}  // namespace keel::model

// The training step alone (train/step.h), in one process on a tiny GPT-2 (2 layers, 32 wide,
// vocabulary 64, 16 tokens): the first loss is the uniform guess's, ln(vocab); the loss falls on a
// fixed batch; the gradient norm is finite and positive; the step is deterministic; and the
// micro-batch split of a batch (2 x 2 rows or 1 x 4) does not change what it computes.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "keel/model/params.h"
#include "keel/parallel/comm.h"
#include "keel/train/freeze.h"
#include "keel/train/step.h"

namespace keel::train {
namespace {

constexpr int kT = 16, kRows = 4;  // sequences per step

model::ModelConfig Tiny() {
  model::ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.vocab_size = 64;
  c.block_size = kT;
  return c;
}

StepSpec SpecOf(int micro_batch, int n_micro) {
  StepSpec spec;
  spec.model = Tiny();
  spec.dtype = DType::kF32;
  spec.seq_len = kT;
  spec.layout.micro_batch = micro_batch;
  spec.layout.n_micro = n_micro;
  return spec;
}

// Row r of the fixed batch: tokens spread over the vocabulary, each followed by a function of it,
// so that there is something to learn.
void Row(int r, int32_t* tokens, int32_t* targets) {
  for (int t = 0; t < kT; ++t) {
    tokens[t] = (r * 17 + t * 5) % 64;
    targets[t] = (tokens[t] * 3 + 1) % 64;
  }
}

struct Result {
  std::vector<double> losses, norms;  // per step: mean loss per token, gradient norm
};

// `steps` optimizer steps over the same batch of kRows rows, split into micro-batches of
// `micro_batch` rows, from the weights of seed 1.
Result Train(int micro_batch, int steps, float lr = 1e-2f) {
  const int n_micro = kRows / micro_batch;
  auto comm = parallel::MakeLocalComm();
  TrainStep st(SpecOf(micro_batch, n_micro), *comm);
  {
    const model::ParamLayout whole = model::ParamLayout::Whole(Tiny());
    std::vector<float> init(whole.total());
    model::InitParams(whole, Tiny(), /*seed=*/1, init.data());
    st.SetWeights(init.data());
  }
  Result out;
  for (int s = 0; s < steps; ++s) {
    int row = 0;
    auto next = [&](int32_t* tokens, int32_t* targets) {
      for (int b = 0; b < micro_batch; ++b, ++row) Row(row, tokens + b * kT, targets + b * kT);
      return 0.0;
    };
    const float tokens = float(kRows * kT);
    out.losses.push_back(st.ForwardBackward(n_micro, next, 1.0f / tokens) / tokens);
    EXPECT_EQ(row, kRows);
    const double norm = st.GradNorm();
    out.norms.push_back(norm);
    st.Apply(lr, /*grad_clip=*/1.0f, norm);
  }
  return out;
}

TEST(TrainStep, FirstLossIsTheUniformGuessAndTheLossFalls) {
  const Result r = Train(/*micro_batch=*/kRows, /*steps=*/10);
  // Weights of std 0.02 give logits near 0: every one of the 64 tokens about equally likely.
  EXPECT_NEAR(r.losses.front(), std::log(64.0), 0.1);
  for (size_t s = 0; s < r.losses.size(); ++s) {
    EXPECT_TRUE(std::isfinite(r.losses[s])) << "step " << s;
    EXPECT_TRUE(std::isfinite(r.norms[s])) << "step " << s;
    EXPECT_GT(r.norms[s], 0.0) << "step " << s;
  }
  // Ten AdamW steps on the one batch: well below where it started.
  EXPECT_LT(r.losses.back(), r.losses.front() - 0.3);
  EXPECT_LT(r.losses[5], r.losses.front());
}

TEST(TrainStep, SameWeightsAndDataGiveBitwiseTheSameSteps) {
  const Result a = Train(kRows, 3), b = Train(kRows, 3);
  for (size_t s = 0; s < a.losses.size(); ++s) {
    EXPECT_EQ(a.losses[s], b.losses[s]) << "step " << s;
    EXPECT_EQ(a.norms[s], b.norms[s]) << "step " << s;
  }
}

TEST(TrainStep, TwoMicroBatchesOfTwoAreOneOfFour) {
  // The same rows, summed in another order: float rounding apart, the same step. AdamW divides
  // by the gradients' size, which magnifies their rounding a little: later steps get more room.
  const Result one = Train(/*micro_batch=*/4, 3, 1e-3f), two = Train(/*micro_batch=*/2, 3, 1e-3f);
  ASSERT_EQ(one.losses.size(), two.losses.size());
  for (size_t s = 0; s < one.losses.size(); ++s) {
    const double tol = s == 0 ? 1e-6 : 1e-4;
    EXPECT_NEAR(two.losses[s], one.losses[s], tol * one.losses[s]) << "step " << s;
    EXPECT_NEAR(two.norms[s], one.norms[s], 10 * tol * one.norms[s]) << "step " << s;
  }
  // The steps changed the weights, so the later losses compare trained models, not the init.
  EXPECT_NE(one.losses.back(), one.losses.front());
}

// The tiny model with rank-2 adapters on q, k, v and the MLP's last product.
model::ModelConfig TinyLora() {
  model::ModelConfig cfg = Tiny();
  cfg.lora_rank = 2;
  cfg.lora_alpha = 4;
  cfg.lora_targets = model::kLoraQkv | model::kLoraFcProj;
  return cfg;
}

// One micro-batch of all kRows rows of `cfg` in `dtype`, all but the adapters frozen.
StepSpec LoraSpec(const model::ModelConfig& cfg, DType dtype) {
  StepSpec spec = SpecOf(kRows, 1);
  spec.model = cfg;
  spec.dtype = dtype;
  spec.frozen = FrozenParams("", model::ParamLayout::Whole(cfg));
  return spec;
}

// The model's initial weights, seed 1.
std::vector<float> InitialWeights(const model::ModelConfig& cfg) {
  const model::ParamLayout whole = model::ParamLayout::Whole(cfg);
  std::vector<float> init(whole.total());
  model::InitParams(whole, cfg, 1, init.data());
  return init;
}

// The summed loss of the fixed batch in one micro-batch (the gradients accumulate).
double BatchLoss(TrainStep& st) {
  int row = 0;
  auto next = [&](int32_t* tokens, int32_t* targets) {
    for (int b = 0; b < kRows; ++b, ++row) Row(row, tokens + b * kT, targets + b * kT);
    return 0.0;
  };
  return st.ForwardBackward(1, next, 1.0f / (kRows * kT));
}

// LoRA through the step: its frozen base ([optim] freeze's machinery, all but the adapters) comes
// out bitwise the weights it went in with (bf16: their bf16 rounding, which is all the run keeps of
// them; biases stay fp32), the adapters move, the loss falls, and the state is the adapters' alone:
// master weights, moments and gradients of the adapters, the working copy holding the base.
void LoraTrains(DType dtype) {
  const model::ModelConfig cfg = TinyLora();
  const StepSpec spec = LoraSpec(cfg, dtype);
  const model::ParamLayout whole = model::ParamLayout::Whole(cfg);
  auto comm = parallel::MakeLocalComm();
  TrainStep st(spec, *comm);
  const std::vector<float> init = InitialWeights(cfg);
  st.SetWeights(init.data());
  std::vector<double> losses;
  for (int s = 0; s < 8; ++s) {
    losses.push_back(BatchLoss(st) / (kRows * kT));
    st.Apply(3e-2f, 1.0f, st.GradNorm());
  }
  EXPECT_LT(losses.back(), losses.front() - 0.05);
  const std::vector<float> after = st.GatherWeights();
  size_t adapters = 0, moved = 0;
  for (const model::ParamInfo& p : whole.params()) {
    const bool adapter = model::IsLoraParam(p.name);
    const bool rounded = dtype == DType::kBF16 && p.bias_index == SIZE_MAX;
    adapters += adapter ? p.numel : 0;
    for (size_t i = 0; i < p.numel; ++i) {
      const float was = init[p.offset + i];
      if (!adapter) {
        ASSERT_EQ(after[p.offset + i], rounded ? ToFloat(ToBf16(was)) : was)
            << p.name << "[" << i << "] moved";
      } else {
        moved += after[p.offset + i] != was;
      }
    }
  }
  EXPECT_EQ(adapters, size_t(2 * (2 * 32 + 96 * 2) + 2 * (2 * 128 + 32 * 2)));
  EXPECT_GT(moved, adapters / 2);
  // The compact state: 4 bytes of master, 8 of moments and 4 of gradient per adapter weight,
  // nothing for the base.
  ASSERT_TRUE(st.store().compact());
  const nlohmann::json bytes = st.MemoryBytes();
  EXPECT_EQ(bytes.at("master").get<size_t>(), 4 * adapters);
  EXPECT_EQ(bytes.at("adam_moments").get<size_t>(), 8 * adapters);
  EXPECT_EQ(bytes.at("grads").get<size_t>(), 4 * (adapters + 2 * 32));  // + the norms' scratch
  EXPECT_EQ(bytes.at("working").get<size_t>(), (dtype == DType::kBF16 ? 2 : 4) * whole.total());
}

TEST(TrainStep, LoraTrainsItsAdaptersOnlyAndTheBaseStaysBitwise) { LoraTrains(DType::kF32); }
TEST(TrainStep, LoraInBf16KeepsTheBaseInItsWorkingCopyOnly) { LoraTrains(DType::kBF16); }

// DoRA in bf16 reads its magnitudes from the fp32 copy the biases have (ParamInfo::bias_index):
// each update must refresh it. After a few steps, the step computes what a step set afresh with
// its weights computes, bit for bit; with the copy left at the first magnitudes it would not.
TEST(TrainStep, DoraInBf16ComputesWithItsTrainedMagnitudes) {
  model::ModelConfig cfg = TinyLora();
  cfg.lora_dora = true;
  const StepSpec spec = LoraSpec(cfg, DType::kBF16);
  const model::ParamLayout whole = model::ParamLayout::Whole(cfg);
  auto comm = parallel::MakeLocalComm();
  TrainStep st(spec, *comm);
  const std::vector<float> init = InitialWeights(cfg);
  st.SetWeights(init.data());
  for (int s = 0; s < 4; ++s) {
    BatchLoss(st);
    st.Apply(3e-2f, 1.0f, st.GradNorm());
  }
  const std::vector<float> now = st.GatherWeights();
  size_t moved = 0;
  for (const model::ParamInfo& p : whole.params())
    if (model::IsDoraMagnitude(p.name))
      for (size_t i = 0; i < p.numel; ++i) moved += now[p.offset + i] != init[p.offset + i];
  EXPECT_GT(moved, size_t(0));
  TrainStep fresh(spec, *comm);
  fresh.SetWeights(now.data());
  EXPECT_EQ(BatchLoss(st), BatchLoss(fresh));
}

// A LoRA state set a tensor at a time (what a run from random weights does: model::InitTensor, no
// whole fp32 copy) is the state set from the whole model's initial values: the same weights back
// and the same first loss, bitwise, with a bf16 and an int8 base.
TEST(TrainStep, LoraSetATensorAtATimeIsTheWholeSet) {
  for (model::BaseQuant q : {model::BaseQuant::kNone, model::BaseQuant::kInt8}) {
    SCOPED_TRACE(model::BaseQuantName(q));
    model::ModelConfig cfg = TinyLora();
    cfg.lora_base = q;
    const StepSpec spec = LoraSpec(cfg, DType::kBF16);
    const model::ParamLayout whole = model::ParamLayout::Whole(cfg);
    auto comm = parallel::MakeLocalComm();
    TrainStep a(spec, *comm), b(spec, *comm);
    std::vector<float> init(whole.total());
    model::InitParams(whole, cfg, 1, init.data());
    a.SetWeights(init.data());
    b.SetWeights([&](const model::ParamInfo& p, std::vector<float>& scratch) {
      scratch.resize(p.numel);
      model::InitTensor(p, cfg, 1, scratch.data());
      return scratch.data();
    });
    EXPECT_EQ(a.GatherWeights(), b.GatherWeights());
    EXPECT_EQ(BatchLoss(a), BatchLoss(b));
  }
}

}  // namespace
}  // namespace keel::train

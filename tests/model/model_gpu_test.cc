// Whole models on the GPU backend against the CPU backend: GPT-2 and Llama (tiny shapes), fp32
// and bf16, and the Llama with LoRA adapters on a frozen base (bf16 working weights, int8, nf4),
// the same weights and batch; the loss and every parameter's gradient must agree. The
// CPU backend's model is held to PyTorch by tests/reference; this carries that to the GPU. Skips,
// saying why, where no GPU is visible (scripts/gpu_check.sh runs it on one).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "keel/core/error.h"
#include "keel/kernels/backend.h"
#include "keel/model/config.h"
#include "keel/model/params.h"
#include "keel/model/transformer.h"

namespace keel::model {
namespace {

const kernels::Backend* GpuOrSkip() {
  std::string why;
  if (!kernels::CudaBuilt()) {
    why = "this keel was built without the CUDA backend";
  } else {
    try {
      return &kernels::Get(kernels::Device::kCuda);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  if (std::getenv("KEEL_REQUIRE_GPU")) ADD_FAILURE() << "KEEL_REQUIRE_GPU is set: " << why;
  std::printf("[  SKIPPED ] no GPU backend here: %s\n", why.c_str());
  return nullptr;
}

struct Result {
  double loss;
  std::vector<float> grads;
};

// "NAME" or "NAME+lora" / "+int8" / "+nf4": rank-4 adapters on every product of a frozen base,
// stored as the working dtype or quantized.
ModelConfig ConfigOf(const std::string& name) {
  const size_t plus = name.find('+');
  ModelConfig cfg = NamedConfig(name.substr(0, plus));
  if (plus == std::string::npos) return cfg;
  const std::string base = name.substr(plus + 1);
  cfg.lora_rank = 4;
  cfg.lora_alpha = 8;
  cfg.lora_targets = kLoraQkv | kLoraProj | kLoraFc | kLoraFcProj;
  cfg.lora_base = ParseBaseQuant(base == "lora" ? "none" : base, "test");
  return cfg;
}

Result RunModel(const std::string& name, DType dt, const kernels::Backend& be) {
  const ModelConfig cfg = ConfigOf(name);
  const int B = 2, T = 32;
  Transformer m(cfg, dt, B, T, Recompute::kNone, nullptr, be);
  std::vector<float> w(m.layout().total());
  InitParams(m.layout(), cfg, 7, w.data());
  std::vector<bool> frozen;
  for (const ParamInfo& p : m.layout().params()) {
    frozen.push_back(cfg.lora_rank > 0 && !IsLoraParam(p.name));
    // B not zero, so that the adapters' gradients are not.
    if (p.name.ends_with("lora_B.weight"))
      for (size_t i = 0; i < p.numel; ++i) w[p.offset + i] = 0.01f * float(int(i % 7) - 3);
  }
  be.FromHost(m.master(), w.data(), 4 * w.size());
  m.SyncWorking();
  m.SetFrozen(frozen);
  m.ZeroGrads();
  std::vector<int32_t> tokens(size_t(B) * T), targets(size_t(B) * T);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t((i * 131 + 7) % 50257);
    targets[i] = i % 11 == 3 ? -1 : int32_t((i * 977 + 1) % 50257);
  }
  Result r;
  r.loss = m.ForwardBackward(tokens.data(), targets.data(), 1.0f / (B * T));
  r.grads.resize(m.layout().grad_total());
  be.ToHost(r.grads.data(), m.grads(), 4 * r.grads.size());
  return r;
}

class ModelOnGpu : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(ModelOnGpu, LossAndGradientsMatchTheCpu) {
  const kernels::Backend* gpu = GpuOrSkip();
  if (!gpu) GTEST_SKIP() << "no GPU backend here";
  const auto& [name, dt] = GetParam();
  const Result want = RunModel(name, dt, kernels::Cpu()), got = RunModel(name, dt, *gpu);
  const double loss_tol = dt == DType::kF32 ? 1e-5 : 1e-2,
               grad_tol = dt == DType::kF32 ? 1e-4 : 5e-2;
  EXPECT_NEAR(got.loss, want.loss, loss_tol * std::fabs(want.loss)) << name;
  // Per parameter: the largest difference against the parameter's largest gradient.
  const ModelConfig cfg = ConfigOf(name);
  const ParamLayout layout = ParamLayout::Whole(cfg);
  for (const ParamInfo& p : layout.params()) {
    // A LoRA layout's frozen tensors have no gradient (the norms' a scratch nobody reads).
    if (p.grad_offset == SIZE_MAX || (cfg.lora_rank > 0 && !IsLoraParam(p.name))) continue;
    double scale = 1e-30, err = 0;
    for (size_t i = p.grad_offset; i < p.grad_offset + p.numel; ++i) {
      scale = std::max(scale, double(std::fabs(want.grads[i])));
      err = std::max(err, double(std::fabs(want.grads[i] - got.grads[i])));
    }
    EXPECT_LE(err / scale, grad_tol) << name << " " << DTypeName(dt) << ": " << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ModelOnGpu,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama-tiny",
                                                              "llama-tiny+lora", "llama-tiny+int8",
                                                              "llama-tiny+nf4"),
                                            ::testing::Values(DType::kF32, DType::kBF16)),
                         [](const auto& info) {
                           std::string n =
                               std::get<0>(info.param) + "_" + DTypeName(std::get<1>(info.param));
                           for (char& c : n)
                             if (c == '-' || c == '+') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace keel::model

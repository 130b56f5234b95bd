// Writes what the PyTorch oracle (model_reference.py) checks keel against: for one small model of
// the family asked for (GPT-2 or Llama) and one random batch, per precision, a safetensors file
// holding
//   init.<name>   the initial fp32 master weights (keel's names and [out, in] shapes)
//   tokens, targets (B, T)   token ids stored as F32 (exact: ids < 2^24)
//   loss          (1)        mean loss of the batch from ForwardBackward
//   logits        (B*T, V)   ForwardLogits of the initial weights (fp32 run only)
//   grad.<name>              gradients of the mean loss (dloss = 1/(B*T)) after one step
//   train_losses  (10)       mean loss before each of 10 AdamW steps on the same batch
// Six cases: fp32, bf16 and fp16 from keel's initial weights (with the 10 steps), and the same
// from "sharp" weights (see Sharpen; no steps). fp16 (CPU only) scales the loss's gradient by
// kFp16LossScale and the gradients back, as the dynamic loss scaler does in training.
// The config (and the AdamW settings) go into the metadata, so the script needs no constants.
// The steps follow src/keel/train/trainer.cc: zero grads, forward/backward, global norm, clip
// scale, AdamW step (which also refreshes the bf16 working copy).
//
//   dump_model <out_dir> [gpt2|llama] [cpu|cuda]   →
//   <out_dir>/keel_{fp32,bf16,fp16}{,_sharp}.safetensors
// The device (default cpu) is the backend the model and optimizer run on: scripts/gpu_check.sh
// holds the GPU path to PyTorch with `cuda`.
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "keel/ckpt/safetensors.h"
#include "keel/core/rng.h"
#include "keel/model/params.h"
#include "keel/model/transformer.h"
#include "keel/optim/adamw.h"

namespace {

using keel::DType;
using keel::model::Transformer;

// vocab 50257 is not a multiple of 128, so the padded wte rows and logit masking are exercised.
// The Llama has two query heads per key/value head and a SwiGLU width (176) that is not a
// multiple of 16.
keel::model::ModelConfig Config(const std::string& family) {
  if (family == "llama") return keel::model::NamedConfig("llama-tiny");
  return {/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/64, /*vocab_size=*/50257, /*block_size=*/64};
}
constexpr int kB = 2, kT = 32, kSteps = 10;
constexpr uint64_t kInitSeed = 1234, kBatchSeed = 99;
constexpr float kLr = 1e-3f, kGradClip = 1.0f, kFp16LossScale = 1024.0f;
constexpr keel::optim::AdamWHyper kHyper{/*beta1=*/0.9f, /*beta2=*/0.95f, /*eps=*/1e-8f,
                                         /*weight_decay=*/0.1f};

std::vector<int64_t> Shape64(const std::vector<int>& s) { return {s.begin(), s.end()}; }

// %.9g round-trips a float exactly (std::to_string would print eps 1e-8 as 0.000000).
std::string Num(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", double(x));
  return buf;
}

// At keel's initialization the attention is nearly uniform and GELU's input is small, so a wrong
// head layout, attention scale or GELU approximation changes the numbers by less than the
// tolerance. The "sharp" case scales the random matrices by 10 (attention logits of order 1-10)
// and draws the LayerNorm gains and all biases at random, so every one of those shows.
void Sharpen(const keel::model::ParamLayout& layout, float* w) {
  const auto& ps = layout.params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const keel::model::ParamInfo& p = ps[i];
    const keel::Philox rng(kInitSeed, /*stream=*/1000 + i);
    for (size_t j = 0; j < p.numel; ++j)
      w[p.offset + j] = p.init_std > 0 ? 10.0f * w[p.offset + j]  // padded wte rows stay 0
                                       : p.init_value + 0.2f * rng.Normal(j);
  }
}

// Writes one case: keel's initial weights (sharp = false) with `steps` AdamW steps, or the
// sharpened weights.
void Dump(const keel::model::ModelConfig& cfg, DType dtype, bool sharp, int steps,
          const std::string& path, const keel::kernels::Backend& be) {
  const int BT = kB * kT, V = cfg.vocab_size;
  Transformer m(cfg, dtype, kB, kT, keel::model::Recompute::kNone, nullptr, be);
  const auto& layout = m.layout();
  std::vector<float> init(layout.total());
  keel::model::InitParams(layout, cfg, kInitSeed, init.data());
  if (sharp) Sharpen(layout, init.data());
  be.FromHost(m.master(), init.data(), 4 * init.size());
  m.SyncWorking();

  std::vector<int32_t> tokens(BT), targets(BT);
  std::vector<float> tokens_f(BT), targets_f(BT);
  const keel::Philox rng(kBatchSeed, 0);
  for (int i = 0; i < BT; ++i) {
    tokens[i] = int32_t(rng.Bits(2 * i)[0] % V);
    targets[i] = int32_t(rng.Bits(2 * i + 1)[0] % V);
    tokens_f[i] = float(tokens[i]);
    targets_f[i] = float(targets[i]);
  }

  std::vector<float> logits;
  if (dtype == DType::kF32) {
    logits.resize(size_t(BT) * V);
    m.ForwardLogits(tokens.data(), logits.data());
  }

  // fp16 scales the loss's gradient up (fp16's small gradients would flush to zero otherwise)
  // and the gradients back down before they are compared or clipped, as a loss scaler does.
  const float scale = dtype == DType::kF16 ? kFp16LossScale : 1.0f;
  const float dloss = scale / float(BT);
  m.ZeroGrads();
  const float loss = float(m.ForwardBackward(tokens.data(), targets.data(), dloss) / BT);
  std::vector<float> grads(layout.total());
  be.ToHost(grads.data(), m.grads(), 4 * grads.size());
  for (float& g : grads) g /= scale;

  std::vector<keel::optim::ParamRange> ranges;
  for (const auto& p : layout.params()) ranges.push_back({p.offset, p.numel, p.decay});
  keel::optim::AdamW opt(ranges, layout.total(), kHyper, be);
  std::vector<float> train_losses;
  for (int step = 0; step < steps; ++step) {
    m.ZeroGrads();
    train_losses.push_back(float(m.ForwardBackward(tokens.data(), targets.data(), dloss) / BT));
    const double norm = std::sqrt(be.SumSquares(m.grads(), layout.total())) / scale;
    opt.Step(m.master(), m.working_bf16(), m.grads(), kLr,
             keel::optim::ClipScale(norm, kGradClip) / scale);
    if (dtype == DType::kF16) m.SyncWorking();  // AdamW rounds a bf16 copy only
  }

  keel::ckpt::SafetensorsWriter w;
  for (const auto& p : layout.params()) {
    w.Add("init." + p.name, Shape64(p.shape), init.data() + p.offset);
    w.Add("grad." + p.name, Shape64(p.shape), grads.data() + p.offset);
  }
  w.Add("tokens", {kB, kT}, tokens_f.data());
  w.Add("targets", {kB, kT}, targets_f.data());
  w.Add("loss", {1}, &loss);
  if (!logits.empty()) w.Add("logits", {BT, V}, logits.data());
  if (steps > 0) w.Add("train_losses", {steps}, train_losses.data());
  w.SetMetadata("dtype", DTypeName(dtype));
  w.SetMetadata("loss_scale", Num(scale));
  w.SetMetadata("device", be.name());
  w.SetMetadata("weights", sharp ? "sharp" : "init");
  for (const auto& [key, value] : keel::model::ShapeKeys(cfg)) w.SetMetadata(key, value);
  w.SetMetadata("padded_vocab", std::to_string(cfg.padded_vocab()));
  w.SetMetadata("lr", Num(kLr));
  w.SetMetadata("beta1", Num(kHyper.beta1));
  w.SetMetadata("beta2", Num(kHyper.beta2));
  w.SetMetadata("eps", Num(kHyper.eps));
  w.SetMetadata("weight_decay", Num(kHyper.weight_decay));
  w.SetMetadata("grad_clip", Num(kGradClip));
  std::string decay;
  for (const auto& p : layout.params())
    if (p.decay) decay += (decay.empty() ? "" : ",") + p.name;
  w.SetMetadata("decay", decay);
  w.Write(path);
  std::printf("wrote %s (loss %.6f)\n", path.c_str(), loss);
}

}  // namespace

int main(int argc, char** argv) {
  keel::kernels::Device device = keel::kernels::Device::kCpu;
  if (argc < 2 || argc > 4 ||
      (argc >= 3 && std::string(argv[2]) != "gpt2" && std::string(argv[2]) != "llama") ||
      (argc == 4 && !keel::kernels::ParseDevice(argv[3], &device))) {
    std::fprintf(stderr, "usage: %s <out_dir> [gpt2|llama] [cpu|cuda]\n", argv[0]);
    return 2;
  }
  try {
    const std::string dir = argv[1];
    const keel::model::ModelConfig cfg = Config(argc >= 3 ? argv[2] : "gpt2");
    const keel::kernels::Backend& be = keel::kernels::Get(device);
    Dump(cfg, DType::kF32, /*sharp=*/false, kSteps, dir + "/keel_fp32.safetensors", be);
    Dump(cfg, DType::kBF16, /*sharp=*/false, kSteps, dir + "/keel_bf16.safetensors", be);
    Dump(cfg, DType::kF32, /*sharp=*/true, 0, dir + "/keel_fp32_sharp.safetensors", be);
    Dump(cfg, DType::kBF16, /*sharp=*/true, 0, dir + "/keel_bf16_sharp.safetensors", be);
    if (device == keel::kernels::Device::kCpu) {  // fp16 runs on the CPU backend only so far
      Dump(cfg, DType::kF16, /*sharp=*/false, kSteps, dir + "/keel_fp16.safetensors", be);
      Dump(cfg, DType::kF16, /*sharp=*/true, 0, dir + "/keel_fp16_sharp.safetensors", be);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_model: %s\n", e.what());
    return 1;
  }
  return 0;
}

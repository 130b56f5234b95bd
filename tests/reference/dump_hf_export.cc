// Writes what hf_export_reference.py checks keel's Hugging Face export against: a small GPT-2 with
// "sharp" weights as a keel model file, and keel's fp32 logits of one random batch.
//
//   dump_hf_export <out_dir>  → <out_dir>/keel_model.safetensors   (keel names, WriteModel)
//                               <out_dir>/keel_logits.safetensors  tokens (B, T) as F32,
//                                                                  logits (B*T, V)
// The test then runs `keel ckpt export` on keel_model.safetensors and the script loads the export
// under HF GPT-2's names and Conv1D layout, knowing nothing of keel's.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "keel/ckpt/model_file.h"
#include "keel/ckpt/safetensors.h"
#include "keel/core/rng.h"
#include "keel/model/params.h"
#include "keel/model/transformer.h"

namespace {

// vocab 50257 is not a multiple of 128, so the export must drop keel's padded wte rows.
constexpr keel::model::ModelConfig kConfig{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/64,
                                           /*vocab_size=*/50257, /*block_size=*/64};
constexpr int kB = 2, kT = 32;
constexpr uint64_t kInitSeed = 4321, kBatchSeed = 77;

// As dump_gpt's Sharpen: matrices ×10 (peaked attention, GELU far from linear) and random
// LayerNorm gains and biases, so that a transposed square matrix (attn.c_proj), a swapped q/k/v
// block or a dropped bias changes the logits far beyond the tolerance.
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

void Dump(const std::string& dir) {
  const int BT = kB * kT, V = kConfig.vocab_size;
  keel::model::Transformer m(kConfig, keel::DType::kF32, kB, kT, keel::model::Recompute::kNone);
  const auto& layout = m.layout();
  keel::model::InitParams(layout, kConfig, kInitSeed, m.master());
  Sharpen(layout, m.master());
  m.SyncWorking();

  std::vector<int32_t> tokens(BT);
  std::vector<float> tokens_f(BT);
  const keel::Philox rng(kBatchSeed, 0);
  for (int i = 0; i < BT; ++i) {
    tokens[i] = int32_t(rng.Bits(i)[0] % V);
    tokens_f[i] = float(tokens[i]);
  }
  std::vector<float> logits(size_t(BT) * V);
  m.ForwardLogits(tokens.data(), logits.data());

  keel::ckpt::WriteModel(dir + "/keel_model.safetensors", kConfig, layout, m.master());
  keel::ckpt::SafetensorsWriter w;
  w.Add("tokens", {kB, kT}, tokens_f.data());
  w.Add("logits", {BT, V}, logits.data());
  w.Write(dir + "/keel_logits.safetensors");
  std::printf("wrote %s/keel_model.safetensors and keel_logits.safetensors\n", dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out_dir>\n", argv[0]);
    return 2;
  }
  try {
    Dump(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_hf_export: %s\n", e.what());
    return 1;
  }
  return 0;
}

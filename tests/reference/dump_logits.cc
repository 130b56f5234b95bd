// Runs any model keel can load (a run, a checkpoint, a keel model file, an HF GPT-2 file, an HF
// Llama folder) on a fixed batch and writes what hf_llama_reference.py compares with PyTorch:
//   tokens  (B, T)  ids as F32 (exact below 2^24): (i·7919 + 13) mod V
//   logits  (B·T, V) fp32, from the training forward pass
//   greedy  (N)      ids as F32: greedy decoding (KV cache) of N tokens after the first P tokens
//
//   dump_logits SOURCE OUT.safetensors [B T P N]   (defaults 2 24 5 32)
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "keel/ckpt/model_source.h"
#include "keel/ckpt/safetensors.h"
#include "keel/model/inference.h"
#include "keel/model/transformer.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 7) {
    std::fprintf(stderr, "usage: %s SOURCE OUT.safetensors [B T P N]\n", argv[0]);
    return 2;
  }
  try {
    const int B = argc == 7 ? std::stoi(argv[3]) : 2, T = argc == 7 ? std::stoi(argv[4]) : 24;
    const int P = argc == 7 ? std::stoi(argv[5]) : 5, N = argc == 7 ? std::stoi(argv[6]) : 32;
    keel::ckpt::LoadedModel m = keel::ckpt::LoadAnyModel(argv[1]);
    const int V = m.config.vocab_size;
    std::vector<int32_t> tokens(size_t(B) * T);
    std::vector<float> tokens_f(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = int32_t((i * 7919 + 13) % size_t(V));
      tokens_f[i] = float(tokens[i]);
    }
    keel::model::Transformer model(m.config, keel::DType::kF32, B, T,
                                   keel::model::Recompute::kNone);
    std::copy(m.weights.begin(), m.weights.end(), model.master());
    std::vector<float> logits(size_t(B) * T * V);
    model.ForwardLogits(tokens.data(), logits.data());
    keel::model::Generator gen(m.config, m.weights);
    keel::model::SampleOptions opt;
    opt.max_tokens = N;
    opt.temperature = 0;
    const std::vector<int32_t> out =
        gen.Generate(std::vector<int32_t>(tokens.begin(), tokens.begin() + P), opt);
    const std::vector<float> greedy(out.begin(), out.end());
    keel::ckpt::SafetensorsWriter w;
    w.Add("tokens", {B, T}, tokens_f.data());
    w.Add("logits", {int64_t(B) * T, V}, logits.data());
    w.Add("greedy", {int64_t(greedy.size())}, greedy.data());
    w.SetMetadata("prompt_tokens", std::to_string(P));
    w.SetMetadata("family", keel::model::FamilyName(m.config.family));
    w.Write(argv[2]);
    std::printf("wrote %s: logits of %d x %d tokens, %zu greedy tokens\n", argv[2], B, T,
                greedy.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_logits: %s\n", e.what());
    return 1;
  }
  return 0;
}

// keel generate: sample continuations of a prompt from a trained run, a checkpoint or a model file.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "keel/ckpt/model_file.h"
#include "keel/ckpt/model_source.h"
#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/data/assets.h"
#include "keel/data/tokenizer.h"
#include "keel/model/inference.h"

namespace keel::cli {

void RegisterGenerate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Sample text from a trained model");
  cmd->footer(
      "Examples:\n"
      "  keel generate --run runs/quickstart --prompt \"The jury said\"\n"
      "  keel generate --run runs/quickstart --prompt \"He\" --max-tokens 100 --temperature 0.7 "
      "--top-k 40 --seed 3\n"
      "  keel generate --run runs/quickstart/checkpoints/step_00000200 --prompt \"The\"\n"
      "--run takes a run folder (its newest checkpoint, else its model.safetensors), a checkpoint\n"
      "folder, or a model file (keel's or Hugging Face GPT-2's).");
  static std::string run, prompt;
  static int max_tokens = 64, top_k = 40, count = 1;
  static float temperature = 0.8f;
  static uint64_t seed = 1;
  cmd->add_option("--run", run, "run folder, checkpoint folder, or model file")->required();
  cmd->add_option("--prompt", prompt, "text to continue")->required();
  cmd->add_option("--max-tokens", max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", top_k, "sample among the k likeliest (0 = all)")
      ->capture_default_str();
  cmd->add_option("--seed", seed, "sampling seed")->capture_default_str();
  cmd->add_option("--count", count, "number of samples")->capture_default_str();
  cmd->callback([] {
    if (max_tokens < 0 || top_k < 0 || count < 1 || !(temperature >= 0) || std::isinf(temperature))
      ThrowBadInput(
          "generate: expected --max-tokens >= 0, --top-k >= 0, --count >= 1 and a "
          "finite --temperature >= 0; got " +
          std::to_string(max_tokens) + ", " + std::to_string(top_k) + ", " + std::to_string(count) +
          " and " + std::to_string(temperature));
    ckpt::LoadedModel m = ckpt::LoadAnyModel(run);
    auto tok = data::Tokenizer::LoadGpt2(data::TokenizerDir());
    model::Generator gen(m.config, std::move(m.weights));
    auto ids = tok.Encode(prompt);
    for (int i = 0; i < count; ++i) {
      model::SampleOptions opt{max_tokens, temperature, top_k, seed + uint64_t(i), tok.eos_id()};
      auto out = gen.Generate(ids, opt);
      const bool stopped = !out.empty() && out.back() == tok.eos_id();
      if (stopped) out.pop_back();
      if (!stopped && int(out.size()) < max_tokens)
        std::fprintf(stderr,
                     "keel: generate: stopped after %zu tokens at the model's context of %d "
                     "(prompt %zu + generated), short of --max-tokens %d\n",
                     out.size(), m.config.block_size, ids.size(), max_tokens);
      std::printf("%s%s\n", prompt.c_str(), tok.Decode(out).c_str());
      if (i + 1 < count) std::printf("---\n");
    }
  });
}

}  // namespace keel::cli

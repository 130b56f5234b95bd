// keel generate: sample continuations of a prompt from a trained run's model.safetensors.
#include <cstdio>
#include <filesystem>

#include "keel/ckpt/model_file.h"
#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/data/tokenizer.h"
#include "keel/model/inference.h"
#include "keel/train/samples.h"

namespace keel::cli {

void RegisterGenerate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Sample text from a trained model");
  cmd->footer(
      "Examples:\n"
      "  keel generate --run runs/quickstart --prompt \"The jury said\"\n"
      "  keel generate --run runs/quickstart --prompt \"He\" --max-tokens 100 --temperature 0.7 "
      "--top-k 40 --seed 3");
  static std::string run, prompt;
  static int max_tokens = 64, top_k = 40, count = 1;
  static float temperature = 0.8f;
  static uint64_t seed = 1;
  cmd->add_option("--run", run, "run directory (holds model.safetensors), or the file itself")
      ->required();
  cmd->add_option("--prompt", prompt, "text to continue")->required();
  cmd->add_option("--max-tokens", max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", top_k, "sample among the k likeliest (0 = all)")
      ->capture_default_str();
  cmd->add_option("--seed", seed, "sampling seed")->capture_default_str();
  cmd->add_option("--count", count, "number of samples")->capture_default_str();
  cmd->callback([] {
    std::string path = run;
    if (std::filesystem::is_directory(path)) path += "/model.safetensors";
    if (!std::filesystem::exists(path))
      ThrowBadInput(path + ": no such file (expected a run directory with model.safetensors)");
    if (max_tokens < 0 || temperature < 0 || top_k < 0)
      ThrowBadInput("generate: --max-tokens, --temperature and --top-k must be >= 0");
    ckpt::LoadedModel m = ckpt::ReadModel(path);
    auto tok = data::Tokenizer::LoadGpt2(train::TokenizerDir());
    model::Generator gen(m.config, std::move(m.weights));
    auto ids = tok.Encode(prompt);
    for (int i = 0; i < count; ++i) {
      model::SampleOptions opt{max_tokens, temperature, top_k, seed + uint64_t(i), tok.eos_id()};
      auto out = gen.Generate(ids, opt);
      if (!out.empty() && out.back() == tok.eos_id()) out.pop_back();
      std::printf("%s%s\n", prompt.c_str(), tok.Decode(out).c_str());
      if (i + 1 < count) std::printf("---\n");
    }
  });
}

}  // namespace keel::cli

// keel generate: sample continuations of a prompt from a trained run, a checkpoint or a model file.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "keel/ckpt/model_file.h"
#include "keel/ckpt/model_source.h"
#include "keel/ckpt/peft.h"
#include "keel/cli/model_tokenizer.h"
#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/data/chat_format.h"
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
      "  keel generate --run runs/chat --chat --prompt \"What is 3 plus 4?\" --temperature 0\n"
      "--run takes a run folder (its newest checkpoint, else its model.safetensors), a checkpoint\n"
      "folder, or a model file (keel's or Hugging Face GPT-2's).\n"
      "--chat: --prompt is a user's message to a model tuned on chat data (keel data prepare\n"
      "--format chat); it goes through the chat template that data was prepared with (plain:\n"
      "\"User: ...\\nAssistant:\", or llama3's) and the assistant's reply is printed, up to its\n"
      "end of turn.\n"
      "The tokenizer is the model's: its run's training data's (meta.json), or a Hugging Face\n"
      "folder's tokenizer.json; GPT-2's for a bare model file. --tokenizer overrides it.");
  static std::string run, prompt, system, adapter, tokenizer;
  static bool chat = false;
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
  cmd->add_flag("--chat", chat, "--prompt is a user's message: print the assistant's reply");
  cmd->add_option("--system", system, "with --chat: a system message before the user's");
  cmd->add_option("--tokenizer", tokenizer,
                  "gpt2, cl100k, o200k, llama3 or a tokenizer.json (default: the model's)");
  cmd->add_option("--adapter", adapter,
                  "a PEFT LoRA adapter folder merged into the model first (keel ckpt export "
                  "--adapter writes one)");
  cmd->callback([] {
    if (max_tokens < 0 || top_k < 0 || count < 1 || !(temperature >= 0) || std::isinf(temperature))
      ThrowBadInput(
          "generate: expected --max-tokens >= 0, --top-k >= 0, --count >= 1 and a "
          "finite --temperature >= 0; got " +
          std::to_string(max_tokens) + ", " + std::to_string(top_k) + ", " + std::to_string(count) +
          " and " + std::to_string(temperature));
    ckpt::LoadedModel m = ckpt::LoadAnyModel(run);
    if (!adapter.empty()) ckpt::MergePeftAdapter(adapter, m.config, &m.weights);
    // A run whose config no longer loads (its data moved) leaves the tokenizer unknown: GPT-2's
    // must then match the model's vocabulary exactly.
    std::optional<KnownTokenizer> known;
    try {
      known = TokenizerOfModel(run, RunConfigOf(run));
    } catch (const Error&) {
    }
    const data::Tokenizer tok = LoadModelTokenizer(tokenizer, known, m.config, "generate");
    if (!system.empty() && !chat) ThrowBadInput("generate: --system needs --chat");
    // The template keel data prepare --format chat chose for the run's data (chat_format.h).
    const data::ChatTemplate tmpl = data::ChooseChatTemplate(
        known && tokenizer.empty() && !known->chat_template.empty() ? known->chat_template : "auto",
        tok);
    model::Generator gen(m.config, std::move(m.weights));
    int32_t stop = tok.eos_id();
    std::vector<data::ChatMessage> messages;
    if (!system.empty()) messages.push_back({"system", system});
    messages.push_back({"user", prompt});
    const std::vector<int32_t> ids =
        chat ? data::ChatPrompt(messages, tmpl, tok, &stop) : tok.Encode(prompt);
    for (int i = 0; i < count; ++i) {
      model::SampleOptions opt{max_tokens, temperature, top_k, seed + uint64_t(i), stop};
      auto out = gen.Generate(ids, opt);
      const bool stopped = !out.empty() && out.back() == stop;
      if (stopped) out.pop_back();
      if (!stopped && int(out.size()) < max_tokens)
        std::fprintf(stderr,
                     "keel: generate: stopped after %zu tokens at the model's context of %d "
                     "(prompt %zu + generated), short of --max-tokens %d\n",
                     out.size(), m.config.block_size, ids.size(), max_tokens);
      std::string text = tok.Decode(out);
      if (chat) {  // the reply alone: the template puts a space before it and a newline after
        if (text.starts_with(' ')) text.erase(0, 1);
        if (text.ends_with('\n')) text.pop_back();
        std::printf("%s\n", text.c_str());
      } else {
        std::printf("%s%s\n", prompt.c_str(), text.c_str());
      }
      if (i + 1 < count) std::printf("---\n");
    }
  });
}

}  // namespace keel::cli

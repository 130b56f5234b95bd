// keel ckpt export / keel ckpt import: a keel model to Hugging Face's files (GPT2LMHeadModel or
// LlamaForCausalLM: safetensors and config.json) and back. The formats live in keel/ckpt
// (hf_gpt2.h, hf_llama.h); this file reads the arguments and reports.
#include <cstdio>
#include <filesystem>
#include <string>

#include "keel/ckpt/hf_gpt2.h"
#include "keel/ckpt/hf_llama.h"
#include "keel/ckpt/model_file.h"
#include "keel/ckpt/model_source.h"
#include "keel/ckpt/peft.h"
#include "keel/cli/verbs.h"
#include "keel/core/error.h"
#include "keel/core/folder_lock.h"
#include "keel/core/validate.h"
#include "keel/model/params.h"

namespace keel::cli {
namespace {

// Prints what was written; the parameters counted are the file's (no padded vocabulary rows).
// export and import alike create the folder they write into.
void CreateParentDirs(const std::string& out) {
  const auto parent = std::filesystem::path(out).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) ThrowRuntime(parent.string() + ": cannot create the --out folder: " + ec.message());
}

// What export and import write must not be what they read (SRC, or a file in the SRC folder),
// nor lie in a run folder that a job is training.
void CheckTarget(const std::string& what, const std::string& out, const std::string& src) {
  std::vector<std::string> inputs = {src};
  std::error_code ec;
  if (std::filesystem::is_directory(src, ec))
    for (const auto& e : std::filesystem::directory_iterator(src, ec))
      inputs.push_back(e.path().string());
  CheckNotAnInput(what, out, inputs);
  FolderLock::CheckNotInBusyFolder(what, out);
}

void PrintSummary(const std::string& out, const model::ModelConfig& c, const char* kind) {
  const size_t params = model::ParamLayout::Whole(c).total() -
                        size_t(c.padded_vocab() - c.vocab_size) * size_t(c.n_embd);
  const size_t untied = c.tied() ? 0 : size_t(c.padded_vocab() - c.vocab_size) * size_t(c.n_embd);
  std::printf(
      "%s %s: %s, %d layers, %d heads, %d wide, vocabulary %d, context %d, %.2fM parameters "
      "(%s)\n",
      "wrote", out.c_str(), model::FamilyName(c.family), c.n_layer, c.n_head, c.n_embd,
      c.vocab_size, c.block_size, double(params - untied) / 1e6, kind);
}

void AddExport(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand(
      "export",
      "Write a model as Hugging Face files (transformers' from_pretrained loads the folder)");
  cmd->footer(
      "SRC is a run or checkpoint folder, or a keel model file. A GPT-2 becomes\n"
      "GPT2LMHeadModel, a Llama LlamaForCausalLM: --out FILE.safetensors with config.json beside\n"
      "it, or --out FOLDER for FOLDER/model.safetensors and FOLDER/config.json.\n"
      "Examples:\n"
      "  keel ckpt export runs/quickstart --format safetensors --out gpt2-quickstart.safetensors\n"
      "  keel ckpt export runs/llama --out hf/llama-mini     # from_pretrained(\"hf/llama-mini\")\n"
      "  keel ckpt export runs/lora --adapter --out hf/lora  # PeftModel.from_pretrained(base, "
      "...)\n"
      "A LoRA run exports merged (W + s·B·A) unless --adapter, which writes its adapters alone as\n"
      "PEFT does (adapter_config.json, adapter_model.safetensors) for the base it started from.");
  static std::string src, format = "safetensors", out;
  static bool adapter = false;
  cmd->add_option("src", src, "run directory or keel model file")->required();
  cmd->add_option("--format", format, "output format (safetensors: Hugging Face names)")
      ->capture_default_str();
  cmd->add_option("--out", out, "file to write (--adapter: a folder)")->required();
  cmd->add_flag("--adapter", adapter, "a LoRA run's adapters alone, in PEFT's layout");
  cmd->callback([] {
    if (adapter) {
      ckpt::LoadedModel m = ckpt::LoadWeightsForExport(src, /*adapters=*/true);
      if (m.config.lora_rank == 0)
        ThrowBadInput("ckpt export --adapter: " + src +
                      " has no LoRA adapters (expected a LoRA run or one of its checkpoints)");
      CheckTarget("ckpt export --out", out + "/adapter_model.safetensors", src);
      ckpt::WritePeftAdapter(out, m.config, m.weights.data());
      std::printf("wrote %s: PEFT %s adapters, rank %d, alpha %g, on %s of %d layers\n",
                  out.c_str(), m.config.lora_dora ? "DoRA" : "LoRA", m.config.lora_rank,
                  double(m.config.lora_alpha), model::LoraTargetsText(m.config).c_str(),
                  m.config.n_layer);
      return;
    }
    if (format != "safetensors")
      ThrowBadInput("ckpt export: --format \"" + format +
                    "\" is not supported (supported: safetensors, with Hugging Face names)");
    const bool file = out.size() > 12 && out.compare(out.size() - 12, 12, ".safetensors") == 0;
    const std::string path =
        file ? out : (std::filesystem::path(out) / "model.safetensors").string();
    CheckTarget("ckpt export --out", path, src);
    ckpt::LoadedModel m = ckpt::LoadWeightsForExport(src);
    const auto layout = model::ParamLayout::Whole(m.config);
    CreateParentDirs(path);
    if (m.config.llama()) {
      ckpt::WriteHfLlama(path, m.config, layout, m.weights.data());
      PrintSummary(path, m.config, "Hugging Face LlamaForCausalLM, config.json beside it");
    } else {
      ckpt::WriteHfGpt2(path, m.config, layout, m.weights.data());
      PrintSummary(path, m.config,
                   "Hugging Face GPT-2 names, Conv1D layout, config.json beside it");
    }
  });
}

void AddImport(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand(
      "import", "Convert a Hugging Face GPT-2 file or Llama folder into a keel model file");
  cmd->footer(
      "The output loads with keel generate --run, and starts a fine-tuning run as\n"
      "[model] init_from (which also reads the Hugging Face file or folder directly).\n"
      "A Llama is a folder as save_pretrained writes it: config.json, and model.safetensors or\n"
      "the shards model.safetensors.index.json lists (F32, BF16 or F16).\n"
      "n_head is read from the file's metadata, else from the config.json beside a\n"
      "model.safetensors (which must ask for nothing keel's GPT-2 does not compute), else from\n"
      "--n-head, else from the GPT-2 widths (768, 1024, 1280, 1600 → 12, 16, 20, 25 heads).\n"
      "Examples:\n"
      "  keel ckpt import gpt2/model.safetensors --out runs/gpt2/model.safetensors\n"
      "  keel ckpt import tiny.safetensors --out tiny-keel.safetensors --n-head 4\n"
      "  keel ckpt import TinyLlama-1.1B/ --out tinyllama.safetensors");
  static std::string src, out;
  static int n_head = 0;
  cmd->add_option("src", src, "Hugging Face GPT-2 model.safetensors, or a Llama folder")
      ->required();
  cmd->add_option("--out", out, "keel model file to write")->required();
  cmd->add_option("--n-head", n_head, "attention heads, when the file does not say");
  cmd->callback([] {
    if (n_head < 0)
      ThrowBadInput("ckpt import: --n-head must be > 0, got " + std::to_string(n_head));
    const bool llama = ckpt::IsHfLlamaFolder(src);
    if (!llama && std::filesystem::is_directory(src))
      ThrowBadInput(src + ": a folder without a Llama config.json (model_type \"llama\"); give " +
                    "a GPT-2 model.safetensors file or a Hugging Face Llama folder");
    if (!llama && !ckpt::IsHfGpt2File(src))
      ThrowBadInput(src + ": already a keel model file (nothing to import; use it as it is)");
    CheckTarget("ckpt import --out", out, src);
    ckpt::LoadedModel m = llama ? ckpt::ReadHfLlama(src) : ckpt::ReadHfGpt2(src, n_head);
    const auto layout = model::ParamLayout::Whole(m.config);
    CreateParentDirs(out);
    ckpt::WriteModel(out, m.config, layout, m.weights.data());
    PrintSummary(out, m.config, "keel model file");
  });
}

}  // namespace

void AddCkptInteropVerbs(CLI::App& ckpt) {
  AddExport(ckpt);
  AddImport(ckpt);
}

}  // namespace keel::cli

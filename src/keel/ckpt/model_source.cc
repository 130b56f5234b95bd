#include "keel/ckpt/model_source.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "keel/ckpt/checkpoint_dir.h"
#include "keel/ckpt/checkpoint_model.h"
#include "keel/ckpt/hf_gpt2.h"
#include "keel/ckpt/hf_llama.h"
#include "keel/ckpt/peft.h"
#include "keel/core/error.h"

namespace keel::ckpt {

LoadedModel LoadWeightsForExport(const std::string& src, bool adapters) {
  auto read = [adapters](const std::string& dir) {
    return adapters ? ReadCheckpointAdapters(dir) : ReadCheckpointModel(dir);
  };
  namespace fs = std::filesystem;
  if (!fs::exists(src)) ThrowBadInput(src + ": no such file or directory");
  std::string path = src;
  if (fs::exists(fs::path(src) / "manifest.json")) return read(src);
  // Adapters live in a LoRA run's checkpoints only: model files hold merged weights, and reading
  // one (32 GB for an 8B) only to say so would be waste.
  auto no_adapters = [&](const std::string& what) {
    ThrowBadInput(src + ": " + what +
                  " holds no LoRA adapters (expected a LoRA run or one of its checkpoints)");
  };
  if (adapters && !fs::is_directory(src)) no_adapters("a model file");
  if (IsHfLlamaFolder(src)) {
    if (adapters) no_adapters("a Hugging Face model folder");
    return ReadHfLlama(src);
  }
  if (fs::is_directory(src)) {
    // A run or checkpoints folder: its newest checkpoint that reads whole (as resume skips the
    // ones that do not verify, saying so), else the run's model file.
    const auto dirs = ListStepDirs(CheckpointRoot(src));
    std::string skipped;
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
      try {
        LoadedModel m = read(it->path);
        if (!skipped.empty()) std::fprintf(stderr, "%s", skipped.c_str());
        return m;
      } catch (const Error& e) {
        skipped += "keel: skipping checkpoint " + it->path + ": " + e.what() + "\n";
      }
    }
    if (!skipped.empty()) std::fprintf(stderr, "%s", skipped.c_str());
    if (adapters) no_adapters("the folder has no checkpoint that reads, and its model file");
    path = (fs::path(src) / "model.safetensors").string();
    if (!fs::exists(path))
      ThrowBadInput(src + ": directory has no model.safetensors (expected a run directory)");
  }
  return ReadModel(path);
}

LoadedModel LoadAnyModel(const std::string& src) {
  if (!std::filesystem::exists(src))
    ThrowBadInput(src + ": no such file or folder (expected a run folder, a checkpoint or a " +
                  "model file)");
  return std::filesystem::is_directory(src) ? LoadWeightsForExport(src) : ReadAnyModelFile(src);
}

LoadedModel ReadAnyModelFile(const std::string& path, int n_head) {
  return IsHfGpt2File(path) ? ReadHfGpt2(path, n_head) : ReadModel(path);
}

namespace {

void CheckInitConfig(const std::string& where, const model::ModelConfig& file,
                     const model::ModelConfig& cfg) {
  // A LoRA run starts its model's own weights from the file and keeps its adapters' initial ones.
  if (auto d = model::FirstDifference(file, model::BaseModel(cfg)))
    ThrowBadInput(where + ": " + d->key + " is " + d->a + " in the file, " + d->b +
                  " in the config");
}

}  // namespace

std::unique_ptr<TensorSource> OpenInitTensors(const std::string& path,
                                              const model::ModelConfig& cfg) {
  const std::string where = "[model] init_from " + path;
  if (!std::filesystem::exists(path)) ThrowBadInput(where + ": no such file");
  if (!IsHfLlamaFolder(path) && IsHfGpt2File(path)) return nullptr;
  auto src =
      std::make_unique<TensorSource>(IsHfLlamaFolder(path) ? OpenHfLlama(path) : OpenModel(path));
  CheckInitConfig(where, src->config(), cfg);
  return src;
}

void LoadInitWeights(const std::string& path, const model::ModelConfig& cfg, float* master,
                     const std::string& adapter) {
  const std::string where = "[model] init_from " + path;
  if (!std::filesystem::exists(path)) ThrowBadInput(where + ": no such file");
  // An HF file that does not name its heads takes the config's: the shapes cannot contradict it.
  LoadedModel m = IsHfLlamaFolder(path)
                      ? ReadHfLlama(path)
                      : ReadAnyModelFile(path, IsHfGpt2File(path) ? cfg.n_head : 0);
  CheckInitConfig(where, m.config, cfg);
  if (!adapter.empty()) MergePeftAdapter(adapter, m.config, &m.weights);
  if (cfg.lora_rank == 0) {
    std::copy(m.weights.begin(), m.weights.end(), master);
    return;
  }
  const model::ParamLayout base = model::ParamLayout::Whole(m.config);
  const model::ParamLayout whole = model::ParamLayout::Whole(cfg);
  for (const model::ParamInfo& p : base.params())
    std::copy_n(m.weights.data() + p.offset, p.numel, master + whole.Find(p.name).offset);
  model::InitDoraMagnitudes(cfg, master);  // from the file's base, not the drawn one
}

}  // namespace keel::ckpt

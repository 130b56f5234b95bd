#include "keel/cli/model_tokenizer.h"

#include <filesystem>
#include <vector>

#include "keel/core/error.h"
#include "keel/data/assets.h"
#include "keel/data/dataset_meta.h"

namespace keel::cli {

namespace fs = std::filesystem;

std::optional<train::RunConfig> RunConfigOf(const std::string& source) {
  fs::path p = fs::path(source).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "RUN/checkpoints/step_N/"
  // A run folder, a checkpoint in it, or its model file (RUN/model.safetensors: another file
  // beside a config.toml is not taken for a run's).
  std::vector<fs::path> dirs;
  if (fs::is_directory(p))
    dirs = {p, p.parent_path().parent_path()};
  else if (p.filename() == "model.safetensors")
    dirs = {p.parent_path()};
  for (const fs::path& dir : dirs) {
    const fs::path config = dir / "config.toml";
    if (fs::exists(config)) return train::LoadConfig(config.string(), {});
  }
  return std::nullopt;
}

std::optional<KnownTokenizer> TokenizerOfModel(const std::string& source,
                                               const std::optional<train::RunConfig>& run) {
  KnownTokenizer k;
  const fs::path hf = fs::path(source) / "tokenizer.json";
  if (fs::is_directory(source) && fs::exists(hf)) {
    k.spec = hf.string();
    k.from = k.spec;
    try {
      k.vocab_size = data::Tokenizer::Load(k.spec, data::AssetsDir()).vocab_size();
    } catch (const Error&) {
      return std::nullopt;  // one keel does not read (SentencePiece's): unknown, not an error
    }
    return k;
  }
  if (!run) return std::nullopt;
  const std::string data =
      run->data.sources.empty() ? run->data.train : run->data.sources.front().path;
  if (data.empty()) return std::nullopt;
  if (!fs::exists(fs::path(data) / "meta.json")) {
    if (!fs::is_regular_file(data)) return std::nullopt;  // gone, or a URL: nothing to read
    k.spec = "gpt2";
    k.from = data + " (a flat token file: GPT-2's)";
    k.vocab_size = 50257;
    return k;
  }
  const data::DatasetMeta meta = data::ReadDatasetMeta(data);
  k.spec = data::TokenizerSpec(&meta);
  k.from = (fs::path(data) / "meta.json").string();
  k.vocab_size = meta.vocab_size;
  if (meta.prepare) k.chat_template = meta.prepare->chat_template;
  return k;
}

data::Tokenizer LoadModelTokenizer(const std::string& flag,
                                   const std::optional<KnownTokenizer>& known,
                                   const model::ModelConfig& cfg, const std::string& verb) {
  const std::string spec = !flag.empty() ? flag : known ? known->spec : "gpt2";
  data::Tokenizer tok = data::Tokenizer::Load(spec, data::AssetsDir());
  const std::string what = !flag.empty() ? "--tokenizer " + flag
                           : known       ? "the tokenizer of " + known->from + " (" + spec + ")"
                                         : "GPT-2's tokenizer (the default for a model file)";
  // A model's vocabulary may be padded past its tokenizer's (nanoGPT's 50304), never short of it;
  // GPT-2's taken for want of anything better must match it exactly.
  if (tok.vocab_size() > cfg.vocab_size ||
      (flag.empty() && !known && tok.vocab_size() != cfg.vocab_size))
    ThrowBadInput(verb + ": " + what + " has " + std::to_string(tok.vocab_size()) +
                  " ids, the model's vocabulary " + std::to_string(cfg.vocab_size) +
                  ": give the tokenizer it was trained with (--tokenizer NAME or tokenizer.json)");
  return tok;
}

}  // namespace keel::cli

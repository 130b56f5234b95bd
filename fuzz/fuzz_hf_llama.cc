// Fuzzes reading a Hugging Face Llama folder (ckpt::ReadHfLlama: config.json's keys,
// model.safetensors.index.json's weight_map, the shards' tensor names and shapes, tied
// embeddings), and checks that what it accepts, WriteHfLlama writes back and ReadHfLlama reads
// back bit for bit.
//
// Input: config.json, model.safetensors.index.json, and one or two shards, separated by kSep
// (fuzz_util.h). The shards are model-00001-of-00002.safetensors and
// model-00002-of-00002.safetensors; with an empty index part there is no index and the first
// shard is model.safetensors. Configs of more than kMaxFloats parameters or kMaxLayers layers are
// skipped: libFuzzer's -rss_limit_mb is 2 GB, and ReadHfLlama checks the floats against the
// machine's memory only, and the layers not at all (each costs some KB of names and maps).
#include <cstring>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "keel/ckpt/hf_llama.h"

namespace {

constexpr double kMaxFloats = 16e6;
constexpr double kMaxLayers = 4096;

// A lenient estimate of the parameters config.json asks for: only integer fields count (read as
// ReadHfLlama reads them), anything else is left for ReadHfLlama to refuse.
bool TooBig(const std::string& config) {
  const nlohmann::json j = nlohmann::json::parse(config, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  auto get = [&](const char* key) -> double {
    const auto it = j.find(key);
    return it != j.end() && it->is_number_integer() ? double(it->get<int>()) : 0.0;
  };
  const double C = get("hidden_size"), F = get("intermediate_size"), L = get("num_hidden_layers"),
               V = get("vocab_size") + 128;  // keel pads the vocabulary to a multiple of 128
  return L > kMaxLayers || L * (4 * C * C + 3 * C * F + 2 * C) + 2 * V * C + C > kMaxFloats;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static keel::fuzz::Scratch dir("hf_llama");
  static keel::fuzz::Scratch out("hf_llama_out");
  const std::vector<std::string> parts = keel::fuzz::SplitParts(data, size, 4);
  if (TooBig(parts[0])) return 0;
  dir.Clear();
  // A missing file is a case too: ReadHfLlama must say so.
  dir.Write("config.json", parts[0]);
  const bool indexed = parts.size() > 1 && !parts[1].empty();
  if (indexed) dir.Write("model.safetensors.index.json", parts[1]);
  if (parts.size() > 2)
    dir.Write(indexed ? "model-00001-of-00002.safetensors" : "model.safetensors", parts[2]);
  if (parts.size() > 3) dir.Write("model-00002-of-00002.safetensors", parts[3]);

  keel::fuzz::ExpectOnlyKeelErrors([&] {
    const keel::ckpt::LoadedModel m = keel::ckpt::ReadHfLlama(dir.path());
    keel::fuzz::ExpectSuccess("writing and reading back what ReadHfLlama returned", [&] {
      const keel::model::ParamLayout layout = keel::model::ParamLayout::Whole(m.config);
      keel::fuzz::Check(m.config.llama(), "a Llama folder read as another family");
      keel::fuzz::Check(m.weights.size() == layout.total(), "weights do not fill the layout");
      out.Clear();
      keel::ckpt::WriteHfLlama(out.path() + "/model.safetensors", m.config, layout,
                               m.weights.data());
      const keel::ckpt::LoadedModel again = keel::ckpt::ReadHfLlama(out.path());
      keel::fuzz::Check(SameBits(again.weights, m.weights), "weights changed in a round trip");
      keel::fuzz::Check(again.config.n_embd == m.config.n_embd &&
                            again.config.n_layer == m.config.n_layer &&
                            again.config.n_head == m.config.n_head &&
                            again.config.kv_heads() == m.config.kv_heads() &&
                            again.config.ffn() == m.config.ffn() &&
                            again.config.vocab_size == m.config.vocab_size &&
                            again.config.block_size == m.config.block_size &&
                            again.config.rope_theta == m.config.rope_theta &&
                            again.config.norm_eps == m.config.norm_eps,
                        "the config changed in a round trip");
    });
  });
  return 0;
}

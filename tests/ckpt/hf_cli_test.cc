// `keel ckpt export` / `keel ckpt import` and `[model] init_from` end to end, through the `keel`
// executable: the round trip reproduces the model file byte for byte, a fine-tuning run starts
// from the trained weights (the same run from the HF export and from keel's own file), and bad
// input is one line with exit code 2.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "keel/ckpt/hf_gpt2.h"
#include "keel/ckpt/hf_llama.h"
#include "keel/ckpt/model_file.h"
#include "keel/ckpt/safetensors.h"
#include "keel/core/rng.h"
#include "keel/model/params.h"
#include "train/run_util.h"

namespace keel::test {
namespace {

const std::string kKeel = KEEL_BINARY;
const std::string kTiny = std::string(KEEL_SOURCE_DIR) + "/configs/test-tiny.toml";

// One line on stderr, "keel: error: ...", containing `want`.
void ExpectBadInput(const RunResult& r, const std::string& want) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err.rfind("keel: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << "want " << want << ": " << r.err;
}

TEST(CkptCli, ExportThenImportGivesBackTheModelFileByteForByte) {
  TempDir dir;
  const model::ModelConfig cfg{2, 4, 64, 300, 16};
  const auto layout = model::ParamLayout::Whole(cfg);
  std::vector<float> w(layout.total());
  const Philox rng(3, 0);
  for (size_t i = 0; i < w.size(); ++i) w[i] = rng.Normal(i);
  const auto& wte = layout.Find("wte.weight");  // keel keeps the padded rows at zero
  std::fill(w.begin() + wte.offset + 300 * 64, w.begin() + wte.offset + wte.numel, 0.0f);
  std::filesystem::create_directories(dir / "run");
  ckpt::WriteModel(dir / "run/model.safetensors", cfg, layout, w.data());

  auto r = RunCommand(kKeel + " ckpt export " + (dir / "run") + " --format safetensors --out " +
                      (dir / "hf.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 layers, 4 heads, 64 wide, vocabulary 300, context 16"), std::string::npos)
      << r.out;
  EXPECT_TRUE(ckpt::IsHfGpt2File(dir / "hf.safetensors"));
  r = RunCommand(kKeel + " ckpt import " + (dir / "hf.safetensors") + " --out " +
                 (dir / "back/model.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ReadFile(dir / "back/model.safetensors"), ReadFile(dir / "run/model.safetensors"));
}

TEST(CkptCli, BadInputIsOneLineAndExitCode2) {
  TempDir dir;
  const model::ModelConfig cfg{1, 4, 64, 300, 16};
  const auto layout = model::ParamLayout::Whole(cfg);
  const std::vector<float> w(layout.total(), 0.25f);
  const std::string keel_file = dir / "keel.safetensors", hf = dir / "hf.safetensors";
  ckpt::WriteModel(keel_file, cfg, layout, w.data());
  ckpt::WriteHfGpt2(hf, cfg, layout, w.data());

  ExpectBadInput(RunCommand(kKeel + " ckpt export " + keel_file + " --format gguf --out x"),
                 "--format \"gguf\" is not supported");
  ExpectBadInput(RunCommand(kKeel + " ckpt export " + (dir / "none") + " --out x"),
                 "no such file or directory");
  ExpectBadInput(RunCommand(kKeel + " ckpt export " + hf + " --out x"), "keel.n_layer");
  ExpectBadInput(RunCommand(kKeel + " ckpt import " + keel_file + " --out x"),
                 "already a keel model file");
  ExpectBadInput(RunCommand(kKeel + " ckpt import " + hf + " --out x --n-head 8"),
                 "metadata says n_head 4, but n_head 8 was given");
  ExpectBadInput(RunCommand(kKeel + " ckpt import " + (dir / "none.safetensors") + " --out x"),
                 "cannot open");
}

// A run trained for 30 steps, exported; two fine-tuning runs start from it, one from the HF
// export and one from keel's own model file: both start far below a fresh model's loss (ln V)
// and are bitwise the same run.
TEST(CkptCli, InitFromStartsFineTuningFromEitherFormat) {
  TempDir dir;
  std::string tokens = ReadFile(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.u16");
  ASSERT_GT(tokens.size(), 400000u) << "missing ../shared/data/brown/brown.gpt2.u16";
  const std::string data = dir / "brown.u16";
  std::ofstream(data, std::ios::binary).write(tokens.data(), 400000);
  auto train = [&](const std::string& name, const std::string& extra) {
    return RunCommand("OMP_NUM_THREADS=2 " + kKeel + " train " + kTiny +
                      " --set data.train=" + data + " --set train.out_dir=" + dir.path() +
                      " --set train.name=" + name + " --set optim.lr=1e-2 " + extra);
  };
  auto r = train("base", "--set train.steps=30");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(Losses(dir / "base/metrics.jsonl").size(), 30u);
  r = RunCommand(kKeel + " ckpt export " + (dir / "base") + " --out " + (dir / "hf.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;

  r = train("from_hf", "--set train.steps=3 --set model.init_from=" + (dir / "hf.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("initialized the weights from"), std::string::npos) << r.err;
  r = train("from_keel",
            "--set train.steps=3 --set model.init_from=" + (dir / "base/model.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto from_hf = Losses(dir / "from_hf/metrics.jsonl");
  const auto from_keel = Losses(dir / "from_keel/metrics.jsonl");
  ASSERT_EQ(from_hf.size(), 3u);
  EXPECT_EQ(from_hf, from_keel);
  EXPECT_LT(from_hf[0], std::log(50257.0) - 1.0) << "did not start from the trained weights";

  ExpectBadInput(train("wrong", "--set train.steps=3 --set model.n_layer=3 --set model.init_from=" +
                                    (dir / "hf.safetensors")),
                 "[model] init_from " + (dir / "hf.safetensors") +
                     ": n_layer is 2 in the file, 3 in the config");
}

// A Llama written as an HF folder reads back exactly; a config.json keel cannot honour, or tensors
// of another shape, are one line with exit 2 naming the key or the tensor.
TEST(CkptCli, LlamaFolderRoundTripsAndRefusesWhatKeelCannotRun) {
  TempDir dir;
  const model::ModelConfig cfg = model::NamedConfig("llama-tiny");
  const auto layout = model::ParamLayout::Whole(cfg);
  std::vector<float> w(layout.total());
  model::InitParams(layout, cfg, 5, w.data());
  std::filesystem::create_directories(dir / "hf");
  ckpt::WriteHfLlama(dir / "hf/model.safetensors", cfg, layout, w.data());
  ASSERT_TRUE(ckpt::IsHfLlamaFolder(dir / "hf"));
  const ckpt::LoadedModel back = ckpt::ReadHfLlama(dir / "hf");
  EXPECT_FALSE(model::FirstDifference(back.config, cfg).has_value());
  EXPECT_EQ(back.weights, w);

  const std::string config_path = dir / "hf/config.json";
  const std::string original = ReadFile(config_path);
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = nlohmann::json::parse(original);
    j[key] = value;
    std::ofstream(config_path) << j.dump();
  };
  auto import = [&] {
    return RunCommand(kKeel + " ckpt import " + (dir / "hf") + " --out " + (dir / "k.safetensors"));
  };
  // transformers 5's rope_parameters: its base is read (it was the default 10000), a scaled type
  // is refused as rope_scaling is, and a top-level rope_theta that disagrees is refused.
  {
    nlohmann::json j = nlohmann::json::parse(original);
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
    std::ofstream(config_path) << j.dump();
    EXPECT_EQ(ckpt::ReadHfLlama(dir / "hf").config.rope_theta, 500000.0f);
    j["rope_parameters"]["rope_type"] = "llama3";
    std::ofstream(config_path) << j.dump();
    ExpectBadInput(import(), "rope_parameters");
    j["rope_parameters"]["rope_type"] = "default";
    j["rope_theta"] = 10000.0;
    std::ofstream(config_path) << j.dump();
    ExpectBadInput(import(), "disagree");
  }
  with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}});
  ExpectBadInput(import(), "rope_scaling");
  with("attention_bias", true);
  ExpectBadInput(import(), "attention_bias: attention biases are not supported");
  with("hidden_size", 32);
  ExpectBadInput(import(), "expected shape [50257, 32], got [50257, 64]");
  with("model_type", "mistral");
  ExpectBadInput(import(), "a folder without a Llama config.json");
  std::ofstream(config_path) << original;
  std::filesystem::remove(dir / "hf/model.safetensors");
  ExpectBadInput(import(), "no model.safetensors or model.safetensors.index.json");
}

// Issue 32: a tensor in two shards (the later one zeros) is an error naming both files, not the
// later copy loaded in silence; so is a tensor listed twice in the index; a config.json that asks
// for more memory than the machine has is sized before anything is allocated; export and import
// never write over what they read.
TEST(CkptCli, HfFolderTensorsAppearOnceAndSizesAreCheckedFirst) {
  TempDir dir;
  const model::ModelConfig cfg = model::NamedConfig("llama-tiny");
  const auto layout = model::ParamLayout::Whole(cfg);
  std::vector<float> w(layout.total());
  model::InitParams(layout, cfg, 5, w.data());
  const std::string hf = dir / "hf";
  std::filesystem::create_directories(hf);
  ckpt::WriteHfLlama(hf + "/model.safetensors", cfg, layout, w.data());
  // Split into two shards; the second holds a zero copy of the embedding too.
  const ckpt::SafetensorsFile whole = ckpt::SafetensorsFile::Read(hf + "/model.safetensors");
  ckpt::SafetensorsWriter a, b;
  nlohmann::json index = {{"metadata", nlohmann::json::object()},
                          {"weight_map", nlohmann::json::object()}};
  const ckpt::Fp32Tensor& embed = whole.Get("model.embed_tokens.weight");
  const std::vector<float> zeros(embed.data.size(), 0.0f);
  for (const auto& [name, t] : whole.tensors()) {
    const bool first = name.find("layers.1.") == std::string::npos;
    (first ? a : b).Add(name, t.shape, t.data.data());
    index["weight_map"][name] = first ? "model-1.safetensors" : "model-2.safetensors";
  }
  b.Add("model.embed_tokens.weight", embed.shape, zeros.data());
  a.Write(hf + "/model-1.safetensors");
  b.Write(hf + "/model-2.safetensors");
  std::filesystem::remove(hf + "/model.safetensors");
  std::ofstream(hf + "/model.safetensors.index.json") << index.dump();
  const std::string out = dir / "k.safetensors";
  const auto import = [&] { return RunCommand(kKeel + " ckpt import " + hf + " --out " + out); };
  ExpectBadInput(import(), "model-2.safetensors: tensor \"model.embed_tokens.weight\": also in " +
                               hf + "/model-1.safetensors");
  EXPECT_FALSE(std::filesystem::exists(out));
  // The index names it twice (JSON keeps the later key).
  std::string text = index.dump();
  const std::string key = "\"model.norm.weight\":\"model-1.safetensors\"";
  ASSERT_NE(text.find(key), std::string::npos) << text;
  text.insert(text.find(key), key + ",");
  std::ofstream(hf + "/model.safetensors.index.json") << text;
  ExpectBadInput(import(), "weight_map: tensor \"model.norm.weight\" is listed twice");

  const std::string config_path = hf + "/config.json";
  nlohmann::json config = nlohmann::json::parse(ReadFile(config_path));
  config["hidden_size"] = 1 << 22;
  config["num_attention_heads"] = 1 << 12;
  config["num_key_value_heads"] = 1 << 12;
  std::ofstream(config_path) << config.dump();
  ExpectBadInput(import(), "GiB of memory; this machine has");
  // What the fuzz target found (it reads the folder directly; here the CLI's check of the folder
  // comes first): values of the wrong JSON type were nlohmann's exceptions (exit 1, no file
  // named); a huge layer count took gigabytes of bookkeeping before any check.
  const auto config_with = [&](const std::string& text) {
    std::ofstream(config_path) << text;
    return import();
  };
  ExpectBadInput(config_with("[1, 2]"), "a folder without a Llama config.json");
  nlohmann::json c = config;  // the model's own, before the sizes above
  c["hidden_size"] = 64;
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = 4;
  c["model_type"] = 8;
  ExpectBadInput(config_with(c.dump()), "a folder without a Llama config.json");
  c["model_type"] = "llama";
  c["num_hidden_layers"] = 1000000;
  ExpectBadInput(config_with(c.dump()), "num_hidden_layers: 1000000 is more than keel runs");
  c["num_hidden_layers"] = 4294967297LL;
  ExpectBadInput(config_with(c.dump()), "num_hidden_layers: expected an integer in [0, 2^31)");
  c["num_hidden_layers"] = 2;
  c["tie_word_embeddings"] = 3;
  ExpectBadInput(config_with(c.dump()), "tie_word_embeddings: expected true or false, got 3");

  // Export onto its own source, or import onto the folder it reads: refused, nothing changed.
  const std::string model = dir / "m.safetensors";
  ckpt::WriteModel(model, cfg, layout, w.data());
  const std::string before = ReadFile(model);
  ExpectBadInput(RunCommand(kKeel + " ckpt export " + model + " --out " + model),
                 "which this command reads");
  EXPECT_EQ(ReadFile(model), before);
}

// A Llama trained for 20 steps, exported as an HF folder; fine-tuning from the folder and from
// keel's own model file starts from the trained weights and is bitwise the same run.
TEST(CkptCli, LlamaFineTunesFromAHuggingFaceFolder) {
  TempDir dir;
  std::string tokens = ReadFile(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.u16");
  ASSERT_GT(tokens.size(), 200000u) << "missing ../shared/data/brown/brown.gpt2.u16";
  const std::string data = dir / "brown.u16";
  std::ofstream(data, std::ios::binary).write(tokens.data(), 200000);
  auto train = [&](const std::string& name, const std::string& extra) {
    return RunCommand("OMP_NUM_THREADS=2 " + kKeel + " train " + kTiny +
                      " --set model.name=llama-tiny --set data.train=" + data +
                      " --set train.out_dir=" + dir.path() + " --set train.name=" + name +
                      " --set optim.lr=1e-2 " + extra);
  };
  auto r = train("base", "--set train.steps=20");
  ASSERT_EQ(r.code, 0) << r.err;
  r = RunCommand(kKeel + " ckpt export " + (dir / "base") + " --out " + (dir / "hf"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir / "hf/config.json"));
  r = train("from_hf", "--set train.steps=3 --set model.init_from=" + (dir / "hf"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = train("from_keel",
            "--set train.steps=3 --set model.init_from=" + (dir / "base/model.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto from_hf = Losses(dir / "from_hf/metrics.jsonl");
  ASSERT_EQ(from_hf.size(), 3u);
  EXPECT_EQ(from_hf, Losses(dir / "from_keel/metrics.jsonl"));
  EXPECT_LT(from_hf[0], std::log(50257.0) - 1.0) << "did not start from the trained weights";
  ExpectBadInput(train("wrong",
                       "--set train.steps=3 --set model.n_kv_head=4 --set "
                       "model.init_from=" +
                           (dir / "hf")),
                 ": n_kv_head is 2 in the file, 4 in the config");
}

}  // namespace
}  // namespace keel::test

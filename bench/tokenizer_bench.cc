// Single-thread encode throughput of keel's tokenizer on the texts of a JSONL file, for one
// vocabulary. bench/tokenizer_bench.sh runs it beside the npm tiktoken package and prints the ratio.
//
//   tokenizer_bench gpt2|cl100k|o200k|llama3|TOKENIZER.json ASSET_DIR brown.jsonl [seconds]
// Prints: "keel cold MB/s X warm MB/s Y tokens N" (cold: first pass with an empty word cache;
// warm: best of repeated passes, the steady state of a long prepare run).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/data/tokenizer.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: tokenizer_bench VOCABULARY ASSET_DIR FILE.jsonl [seconds]\n");
    return 2;
  }
  const double seconds = argc > 4 ? std::stod(argv[4]) : 3.0;
  std::vector<std::string> texts;
  size_t bytes = 0;
  std::ifstream in(argv[3]);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    texts.push_back(nlohmann::json::parse(line).at("text").get<std::string>());
    bytes += texts.back().size();
  }
  auto tok = keel::data::Tokenizer::Load(argv[1], argv[2]);
  std::vector<int32_t> ids;
  ids.reserve(bytes / 2);
  auto pass = [&] {
    ids.clear();
    double t0 = Now();
    for (const auto& t : texts) tok.EncodeAppend(t, &ids);
    return Now() - t0;
  };
  const double cold = pass();
  double best = cold, start = Now();
  while (Now() - start < seconds) best = std::min(best, pass());
  std::printf("keel cold_mb_s %.2f warm_mb_s %.2f tokens %zu bytes %zu\n", bytes / cold / 1e6,
              bytes / best / 1e6, ids.size(), bytes);
  return 0;
}

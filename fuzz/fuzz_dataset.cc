// Fuzzes a keel-tokens dataset folder: meta.json with its shard token files and document index
// files, through TokenDataset::Open, reads of every token, CheckIds and VerifyDataset.
//
// Input: meta.json, then shard_00000.bin, shard_00000.idx, shard_00001.bin, ... (up to three
// shards), separated by kSep (fuzz_util.h). The fuzzer cannot forge XXH3 hashes, so an "xxh3" or
// "index_xxh3" of "fill" in meta.json is replaced with the hash of the file it names; otherwise
// VerifyDataset would stop at the hash and never reach the index checks behind it.
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "keel/core/hex.h"
#include "keel/data/dataset.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/verify.h"

namespace {

std::string FillHashes(const std::string& meta, const std::map<std::string, std::string>& files) {
  nlohmann::json j = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("shards") || !j["shards"].is_array()) return meta;
  bool filled = false;
  for (auto& s : j["shards"]) {
    if (!s.is_object()) continue;
    for (const auto& [name_key, hash_key] : {std::pair{"file", "xxh3"}, {"index", "index_xxh3"}}) {
      if (!s.contains(name_key) || !s[name_key].is_string() || !s.contains(hash_key) ||
          s[hash_key] != "fill")
        continue;
      auto it = files.find(s[name_key].get<std::string>());
      if (it == files.end()) continue;
      s[hash_key] = keel::HashHex(XXH3_64bits(it->second.data(), it->second.size()));
      filled = true;
    }
  }
  return filled ? j.dump() : meta;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static keel::fuzz::Scratch dir("dataset");
  dir.Clear();
  std::vector<std::string> parts = keel::fuzz::SplitParts(data, size, 7);
  std::map<std::string, std::string> files;
  uint64_t file_bytes = 0;
  for (size_t i = 1; i < parts.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "shard_%05zu.%s", (i - 1) / 2, i % 2 == 1 ? "bin" : "idx");
    dir.Write(name, parts[i]);
    file_bytes += parts[i].size();
    files[name] = parts[i];
  }
  dir.Write("meta.json", FillHashes(parts[0], files));

  keel::fuzz::ExpectOnlyKeelErrors([&] {
    const keel::data::TokenDataset ds = keel::data::TokenDataset::Open(dir.path());
    const keel::data::DatasetMeta& meta = *ds.meta();
    // Open checked every file's size against meta.json: the tokens it claims must be there.
    keel::fuzz::Check(ds.size() <= file_bytes / meta.token_bytes(),
                      "Open accepted " + std::to_string(ds.size()) + " tokens from " +
                          std::to_string(file_bytes) + " bytes of files");
    // Odd-sized reads cross shard boundaries at every offset.
    std::vector<int32_t> buf(7);
    keel::fuzz::ExpectSuccess("reading every token of an opened dataset", [&] {
      for (size_t i = 0; i < ds.size(); i += buf.size())
        ds.Read(i, std::min(buf.size(), ds.size() - i), buf.data());
    });
    ds.CheckIds(ds.vocab_size());
    const keel::data::VerifySummary sum = keel::data::VerifyDataset(dir.path());
    keel::fuzz::Check(sum.tokens == ds.size() && sum.documents == meta.documents(),
                      "VerifyDataset's counts differ from meta.json's");
  });
  return 0;
}

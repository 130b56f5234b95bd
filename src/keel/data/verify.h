// Full integrity check of a token dataset, for `keel data verify`: every file's XXH3 against
// meta.json, every document index monotone and within its shard, every id below the vocabulary.
// TokenDataset::Open only checks what is cheap (sizes, first and last offsets). For an http(s)
// dataset, every shard is downloaded (hash-checked on arrival) and its ids checked.
//
//   keel::data::VerifySummary s = keel::data::VerifyDataset("data/brown/train");
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace keel::data {

struct VerifySummary {
  uint64_t shards = 0;
  uint64_t tokens = 0;
  uint64_t documents = 0;
  uint64_t bytes = 0;  // token and index bytes hashed
};

// Throws keel::Error (bad input) naming the file and what was expected at the first problem.
VerifySummary VerifyDataset(const std::string& path);

struct DatasetMeta;
// The first part of VerifyDataset for a local dataset folder: each shard's token and index file
// against its xxh3 in meta.json (a flipped byte that still decodes to valid ids shows only here).
// Stops early, returning false, once `*stop` is set. Returns the bytes hashed through `bytes`.
// Throws keel::Error (bad input) naming the file.
bool CheckShardHashes(const std::string& dir, const DatasetMeta& meta,
                      const std::atomic<bool>* stop = nullptr, uint64_t* bytes = nullptr);

}  // namespace keel::data

// Full integrity check of a token dataset, for `keel data verify`: every file's XXH3 against
// meta.json, every document index monotone and within its shard, every id below the vocabulary.
// TokenDataset::Open only checks what is cheap (sizes, first and last offsets). For an http(s)
// dataset, every shard is downloaded (hash-checked on arrival) and its ids checked.
//
//   keel::data::VerifySummary s = keel::data::VerifyDataset("data/brown/train");
#pragma once

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

}  // namespace keel::data

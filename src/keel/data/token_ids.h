// Token ids in shard bytes: little-endian uint16 or uint32 (dataset_meta.h's dtype), read out
// as int32 and checked against a vocabulary. Shared by local and remote datasets.
//
//   keel::data::CheckTokenIds(bytes, n, /*width=*/2, 50257, "train/shard_00000.bin");
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::data {

// out[i] = the i-th id of `bytes`, for i < n.
void DecodeTokenIds(const uint8_t* bytes, uint64_t n, size_t width, int32_t* out);

// Throws keel::Error (bad input) naming `path`, the id and its offset (in tokens and bytes) for
// the first of the n ids that is not in [0, vocab).
void CheckTokenIds(const uint8_t* bytes, uint64_t n, size_t width, int vocab,
                   const std::string& path);

}  // namespace keel::data

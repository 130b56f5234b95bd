// A read-only token dataset: a keel-tokens folder (meta.json + memory-mapped shards, DESIGN.md),
// the same served over http(s) (shards fetched and mapped on first use, remote_shards.h), or a
// flat file of little-endian uint16 tokens. Tokens are addressed by a global index that runs
// across shards in order. Read() may be called from several threads at once.
//
//   auto ds = keel::data::TokenDataset::Open("data/brown/train");
//   std::vector<int32_t> window(T + 1);
//   ds.Read(start, T + 1, window.data());
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace keel::data {

struct DatasetMeta;

class TokenDataset {
 public:
  // Throws keel::Error (bad input) naming the path and what is wrong: missing, truncated, bad
  // meta.json, wrong format or version. A URL is cached under $KEEL_CACHE_DIR within
  // $KEEL_CACHE_BYTES (remote_cache.h); only its meta.json is fetched here.
  static TokenDataset Open(const std::string& path);

  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;
  ~TokenDataset();

  size_t size() const;     // tokens in all shards
  int vocab_size() const;  // from meta.json; 50257 for a flat file
  int eos_id() const;      // from meta.json; 50256 for a flat file
  const std::string& path() const;
  // The dataset's meta.json (a folder or a URL); nullptr for a flat file.
  const DatasetMeta* meta() const;

  // out[i] = token[start + i] for i < n; start + n <= size(). Crosses shard boundaries. For a URL
  // it may download a shard, and throws keel::Error naming the URL if that fails.
  void Read(size_t start, size_t n, int32_t* out) const;

  // A loss-masked dataset (dataset_meta.h): out[i] = 1 where token start + i is trained on, else 0.
  // Unmasked datasets give all ones.
  bool masked() const;
  void ReadMask(size_t start, size_t n, uint8_t* out) const;
  // Where each document starts, in global token indices, then size(): documents() + 1 entries.
  // A flat file is one document.
  std::vector<uint64_t> DocumentBounds() const;

  // Scans every token: throws keel::Error naming the file and offset of the first id >= vocab.
  // For a URL, each shard is scanned when it is downloaded or mapped, before a read of it
  // returns, and the error comes from that read: checking all now would fetch the whole dataset.
  void CheckIds(int vocab) const;

 private:
  struct Impl;
  explicit TokenDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::data

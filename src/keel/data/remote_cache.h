// A local, size-capped cache of a keel-tokens dataset served over http(s): meta.json is fetched
// on open, each shard (.bin and .idx) on first use. Every shard is downloaded under a temporary
// name, checked against the XXH3 in meta.json, and only then renamed into place, so the cache
// never holds a file that was not verified. When the cache would grow past its cap, whole shards
// are evicted least recently used first, never the one being acquired.
//
//   keel::data::RemoteCache cache("https://host/brown/train", {.dir = "/tmp/c", .max_bytes = 1 <<
//   30}); std::string bin = cache.Acquire(0);           // local path of shard 0's token file
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "keel/data/dataset_meta.h"
#include "keel/data/http_fetch.h"

namespace keel::data {

struct RemoteCacheOptions {
  std::string dir;                          // one folder per dataset; created if missing
  uint64_t max_bytes = uint64_t(10) << 30;  // shard bytes (.bin + .idx) kept at most
  HttpOptions http;
};

class RemoteCache {
 public:
  // Downloads BASE_URL/meta.json into dir. If it differs from the meta.json already there, the
  // dataset changed on the server and every cached shard is dropped. Shards already in dir with
  // the sizes meta.json gives are reused without a download (they were verified when written).
  RemoteCache(std::string base_url, RemoteCacheOptions options);
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;

  const DatasetMeta& meta() const { return meta_; }
  const std::string& dir() const { return options_.dir; }
  const std::string& url() const { return base_url_; }

  // Makes shard i's .bin and .idx present in dir (downloading and verifying them if needed),
  // marks it most recently used, and returns the local path of its .bin. Throws keel::Error
  // naming the URL for a hash mismatch (bad input; the file is removed) or a failed download.
  std::string Acquire(size_t shard);

  // Bytes of one shard on disk (.bin + .idx), from meta.json.
  uint64_t ShardBytes(size_t shard) const;
  uint64_t cached_bytes() const { return cached_bytes_; }
  // Shard files (.bin or .idx) downloaded by this object, and shards evicted: for tests and logs.
  uint64_t downloads() const { return downloads_; }
  uint64_t evictions() const { return evictions_; }

 private:
  void Fetch(const std::string& name, const std::string& expected_xxh3);
  void EvictFor(size_t shard);
  void Drop(size_t shard);

  std::string base_url_;
  RemoteCacheOptions options_;
  DatasetMeta meta_;
  std::vector<bool> present_;
  std::vector<uint64_t> last_use_;  // a tick per Acquire; the smallest is the LRU shard
  uint64_t tick_ = 0;
  uint64_t cached_bytes_ = 0;
  uint64_t downloads_ = 0;
  uint64_t evictions_ = 0;
};

// Where TokenDataset::Open caches URL: $KEEL_CACHE_DIR (default ~/.cache/keel) / a folder named
// by the URL's hash, so two datasets never share files; cap from $KEEL_CACHE_BYTES (10 GiB).
RemoteCacheOptions DefaultRemoteCacheOptions(const std::string& url);

}  // namespace keel::data

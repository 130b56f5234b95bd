// A local, size-capped cache of a keel-tokens dataset served over http(s): meta.json is fetched
// on open, each shard (.bin and .idx) on first use. Every shard is downloaded under a temporary
// name, checked against the XXH3 in meta.json, and only then renamed into place, so the cache
// never holds a file that was not verified. When the cache would grow past its cap, whole shards
// are evicted least recently used first, never the one being acquired nor a pinned one (a shard
// that is memory-mapped). Thread-safe: a background thread may fetch ahead while another reads;
// two threads asking for one shard share one download. Processes may share a folder (ranks on
// one machine): each counts the cap for itself, and a shard another one evicted is fetched again.
//
//   keel::data::RemoteCache cache("https://host/brown/train", {.dir = "/tmp/c", .max_bytes = 1 <<
//   30}); std::string bin = cache.Acquire(0);           // local path of shard 0's token file
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
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
  uint64_t max_bytes() const { return options_.max_bytes; }

  // Makes shard i's .bin and .idx present in dir (downloading and verifying them if needed),
  // marks it most recently used, and returns the local path of its .bin. Throws keel::Error
  // naming the URL for a hash mismatch (bad input; the file is removed) or a failed download.
  std::string Acquire(size_t shard);
  // Acquire, and keep the shard from eviction until as many Unpin calls: for a shard that is
  // memory-mapped, whose files must stay. Pins count against the cap like any cached shard.
  std::string Pin(size_t shard);
  void Unpin(size_t shard);
  // Fetch-ahead: like Acquire, but only if room can be made by evicting shards that are neither
  // pinned nor themselves fetched ahead and not used since, so it never takes the cache past its
  // cap nor undoes an earlier fetch-ahead. Returns whether the shard is now cached. Throws as
  // Acquire.
  bool Prefetch(size_t shard);

  // Bytes of one shard on disk (.bin + .idx), from meta.json.
  uint64_t ShardBytes(size_t shard) const;
  // Bytes of the shards cached and being downloaded.
  uint64_t cached_bytes() const;
  bool cached(size_t shard) const;
  // Shard files (.bin or .idx) downloaded by this object, and shards evicted: for tests and logs.
  uint64_t downloads() const { return downloads_; }
  uint64_t evictions() const { return evictions_; }

 private:
  void CheckIndex(size_t shard) const;
  // Makes the shard present, downloading it with mu_ released; false when `must` is false and
  // there is no room without evicting a pinned shard. `lock` holds mu_ on entry and on return.
  bool Fill(size_t shard, std::unique_lock<std::mutex>& lock, bool must);
  void FetchShard(size_t shard);
  void Fetch(const std::string& name, const std::string& expected_xxh3);
  // Evicts LRU unpinned shards (never `shard`) until `shard` fits. When they are not enough:
  // with `must`, fetches anyway past the cap (a shard larger than the cap, or too many pinned);
  // without (a fetch-ahead), evicts nothing and returns false; it also spares shards ahead_.
  bool MakeRoom(size_t shard, bool must);
  void Drop(size_t shard);

  std::string base_url_;
  RemoteCacheOptions options_;
  DatasetMeta meta_;
  // Guards everything below it. Downloads run without it; a shard being downloaded is
  // `fetching`, and whoever else wants it waits on fetched_.
  mutable std::mutex mu_;
  std::condition_variable fetched_;
  std::vector<bool> present_;
  std::vector<bool> fetching_;
  std::vector<int> pins_;
  std::vector<bool> ahead_;         // fetched ahead by Prefetch and not acquired since
  std::vector<uint64_t> last_use_;  // a tick per use; the smallest is the LRU shard
  uint64_t tick_ = 0;
  uint64_t cached_bytes_ = 0;  // present shards plus those being downloaded
  std::atomic<uint64_t> downloads_ = 0;
  std::atomic<uint64_t> evictions_ = 0;
};

// Where TokenDataset::Open caches URL: $KEEL_CACHE_DIR (default ~/.cache/keel) / a folder named
// by the URL's hash, so two datasets never share files; cap from $KEEL_CACHE_BYTES (10 GiB).
RemoteCacheOptions DefaultRemoteCacheOptions(const std::string& url);

}  // namespace keel::data

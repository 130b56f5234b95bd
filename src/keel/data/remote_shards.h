// The shards of a keel-tokens dataset on an http(s) server, as TokenDataset reads them: opening
// fetches meta.json only; each shard is downloaded (RemoteCache) and memory-mapped the first time
// a read touches it, and a background thread then fetches the next `ahead` shards, so a reader
// that moves through the shards in order finds the next one already on disk.
//
// Mapped shards are pinned in the cache. Before mapping one more would take the mapped bytes past
// the cache cap less room for `ahead` shards, the least recently read mapped shards are unmapped
// (and so become evictable); at least one stays mapped whatever the cap.
// So a dataset larger than the cap can be read: it costs a download each time a shard comes back
// after eviction, which suits reading in order (shuffle off, or one pass), not a global shuffle.
//
//   internal::RemoteShards r("http://host/brown/train", {.cache = DefaultRemoteCacheOptions(url)});
//   r.WithShard(3, [&](const uint8_t* bytes) { /* shard 3's tokens, valid inside the call */ });
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "keel/core/file_util.h"
#include "keel/data/remote_cache.h"

namespace keel::data::internal {

struct RemoteShardsOptions {
  RemoteCacheOptions cache;
  int ahead = 2;  // shards fetched ahead of the last one mapped; 0: none, no thread
};

class RemoteShards {
 public:
  // Throws as RemoteCache's constructor does (meta.json missing, not a dataset, server down).
  RemoteShards(const std::string& url, RemoteShardsOptions options);
  RemoteShards(const RemoteShards&) = delete;
  RemoteShards& operator=(const RemoteShards&) = delete;
  // Cancels a fetch-ahead in progress and joins its thread.
  ~RemoteShards();

  const DatasetMeta& meta() const { return cache_.meta(); }
  const std::string& url() const { return cache_.url(); }

  // Calls fn(bytes) with shard i's token bytes mapped, downloading the shard if needed. The
  // pointer is valid only inside the call. Thread-safe; calls are serialized. Throws keel::Error
  // naming the URL for a failed download or a hash mismatch.
  template <typename Fn>
  void WithShard(size_t i, Fn&& fn) {
    std::lock_guard lock(mu_);
    fn(MapLocked(i));
  }

  // From now on every shard is checked for ids outside [0, vocab) when it is mapped, before fn
  // sees it (an error names the URL and offset); shards mapped already are checked here. The
  // lowest vocab asked for wins.
  void CheckIdsOnArrival(int vocab);

  // For tests and logs.
  size_t mapped_shards() const;
  const RemoteCache& cache() const { return cache_; }

 private:
  struct Slot {
    MappedFile tokens;
    bool mapped = false;
    uint64_t last_read = 0;
  };

  const uint8_t* MapLocked(size_t i);
  void Unmap(size_t i);
  void QueueAhead(size_t i);
  void AheadLoop();

  // Declared before cache_, which holds a pointer to it (HttpOptions::cancel).
  std::atomic<bool> stop_ = false;
  RemoteCache cache_;
  const int ahead_;
  uint64_t ahead_reserve_ = 0;  // cache bytes kept free of mapped shards for the fetch-ahead

  mutable std::mutex mu_;  // guards slots_, mapped_bytes_, tick_, id_limit_
  std::vector<Slot> slots_;
  uint64_t mapped_bytes_ = 0;  // RemoteCache::ShardBytes of the mapped shards
  uint64_t tick_ = 0;
  int id_limit_ = 0;  // 0: ids not checked

  std::mutex ahead_mu_;  // guards ahead_queue_
  std::condition_variable ahead_cv_;
  std::deque<size_t> ahead_queue_;
  std::thread ahead_thread_;  // last: started once everything above exists
};

}  // namespace keel::data::internal

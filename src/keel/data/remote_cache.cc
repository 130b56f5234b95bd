// Size-capped, hash-verified local cache of a remote keel-tokens dataset; see remote_cache.h.
#include "keel/data/remote_cache.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/hex.h"

namespace keel::data {
namespace fs = std::filesystem;

namespace {

uint64_t SizeOr(const std::string& path, uint64_t fallback) {
  std::error_code ec;
  uint64_t n = fs::file_size(path, ec);
  return ec ? fallback : n;
}

}  // namespace

RemoteCache::RemoteCache(std::string base_url, RemoteCacheOptions options)
    : base_url_(std::move(base_url)), options_(std::move(options)) {
  while (!base_url_.empty() && base_url_.back() == '/') base_url_.pop_back();
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) ThrowRuntime(options_.dir + ": cannot create the cache folder: " + ec.message());

  // meta.json is tiny and the source of truth, so it is always fetched; it is parsed from a
  // side folder so that a bad one never replaces a good one.
  const std::string incoming = options_.dir + "/.incoming";
  fs::create_directories(incoming, ec);
  const std::string meta_url = base_url_ + "/meta.json";
  HttpDownload(meta_url, incoming + "/meta.json", options_.http);
  try {
    meta_ = ReadDatasetMeta(incoming);
  } catch (const Error& e) {
    ThrowBadInput(meta_url + ": " + e.what());
  }
  const std::string meta_path = options_.dir + "/meta.json";
  const std::string fresh = ReadWholeFile(incoming + "/meta.json");
  std::string old;
  if (fs::exists(meta_path)) old = ReadWholeFile(meta_path);
  const bool changed = old != fresh;
  if (std::rename((incoming + "/meta.json").c_str(), meta_path.c_str()) != 0) {
    ThrowRuntime(meta_path + ": cannot write");
  }
  SyncDir(options_.dir);

  present_.assign(meta_.shards.size(), false);
  fetching_.assign(meta_.shards.size(), false);
  pins_.assign(meta_.shards.size(), 0);
  ahead_.assign(meta_.shards.size(), false);
  last_use_.assign(meta_.shards.size(), 0);
  for (size_t i = 0; i < meta_.shards.size(); ++i) {
    const ShardMeta& s = meta_.shards[i];
    const std::string bin = options_.dir + "/" + s.file, idx = options_.dir + "/" + s.index;
    // Files of an older version of the dataset may have the same names and sizes: drop them.
    if (changed) {
      fs::remove(bin, ec);
      fs::remove(idx, ec);
      continue;
    }
    if (SizeOr(bin, ~0ull) == s.tokens * meta_.token_bytes() &&
        SizeOr(idx, ~0ull) == (s.documents + 1) * 8) {
      present_[i] = true;
      cached_bytes_ += ShardBytes(i);
    }
  }
}

uint64_t RemoteCache::ShardBytes(size_t shard) const {
  const ShardMeta& s = meta_.shards[shard];
  return s.tokens * meta_.token_bytes() + (s.documents + 1) * 8;
}

void RemoteCache::Fetch(const std::string& name, const std::string& expected_xxh3) {
  const std::string url = base_url_ + "/" + name;
  const std::string final_path = options_.dir + "/" + name;
  // Per process: two ranks on one machine may fetch the same shard at once, and must not write
  // into each other's file. Each renames a verified copy; the last rename wins, same bytes.
  const std::string part = final_path + ".part." + std::to_string(::getpid());
  const std::string actual = HashHex(HttpDownload(url, part, options_.http));
  ++downloads_;
  if (actual != expected_xxh3) {
    std::remove(part.c_str());
    ThrowBadInput(url + ": xxh3 " + actual + ", expected " + expected_xxh3 +
                  " per meta.json (corrupt on the server or changed since); not cached");
  }
  if (std::rename(part.c_str(), final_path.c_str()) != 0) {
    std::remove(part.c_str());
    ThrowRuntime(part + ": cannot rename to " + final_path);
  }
}

uint64_t RemoteCache::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_bytes_;
}

bool RemoteCache::cached(size_t shard) const {
  CheckIndex(shard);
  std::lock_guard lock(mu_);
  return present_[shard];
}

void RemoteCache::CheckIndex(size_t shard) const {
  if (shard >= meta_.shards.size()) {
    ThrowRuntime(base_url_ + ": shard " + std::to_string(shard) + " of " +
                 std::to_string(meta_.shards.size()));
  }
}

void RemoteCache::Drop(size_t shard) {
  const ShardMeta& s = meta_.shards[shard];
  std::error_code ec;
  fs::remove(options_.dir + "/" + s.file, ec);
  fs::remove(options_.dir + "/" + s.index, ec);
  present_[shard] = false;
  cached_bytes_ -= ShardBytes(shard);
  ++evictions_;
}

bool RemoteCache::MakeRoom(size_t shard, bool must) {
  const uint64_t need = ShardBytes(shard);
  auto evictable = [&](size_t i) {
    return present_[i] && pins_[i] == 0 && i != shard && (must || !ahead_[i]);
  };
  if (!must) {
    uint64_t freeable = 0;
    for (size_t i = 0; i < present_.size(); ++i) freeable += evictable(i) ? ShardBytes(i) : 0;
    if (cached_bytes_ + need > options_.max_bytes + freeable) return false;
  }
  while (cached_bytes_ + need > options_.max_bytes) {
    size_t lru = present_.size();
    for (size_t i = 0; i < present_.size(); ++i) {
      if (evictable(i) && (lru == present_.size() || last_use_[i] < last_use_[lru])) lru = i;
    }
    if (lru == present_.size()) return true;  // nothing left to evict: fetched past the cap
    Drop(lru);
  }
  return true;
}

void RemoteCache::FetchShard(size_t shard) {
  const ShardMeta& s = meta_.shards[shard];
  Fetch(s.index, s.index_xxh3);
  try {
    Fetch(s.file, s.xxh3);
  } catch (...) {
    std::error_code ec;
    fs::remove(options_.dir + "/" + s.index, ec);  // half a shard is not a shard
    throw;
  }
  SyncDir(options_.dir);
}

bool RemoteCache::Fill(size_t shard, std::unique_lock<std::mutex>& lock, bool must) {
  fetched_.wait(lock, [&] { return !fetching_[shard]; });
  if (present_[shard]) {
    // Another process sharing this folder (a rank on the same machine) may have evicted it: its
    // count of the folder is its own. Then it is fetched again.
    const ShardMeta& s = meta_.shards[shard];
    std::error_code ec;
    if (fs::exists(options_.dir + "/" + s.file, ec) &&
        fs::exists(options_.dir + "/" + s.index, ec)) {
      return true;
    }
    present_[shard] = false;
    cached_bytes_ -= ShardBytes(shard);
  }
  if (!MakeRoom(shard, must)) return false;
  // Counted from now, so that fetches running side by side respect the cap together.
  fetching_[shard] = true;
  cached_bytes_ += ShardBytes(shard);
  lock.unlock();
  std::exception_ptr error;
  try {
    FetchShard(shard);
  } catch (...) {
    error = std::current_exception();
  }
  lock.lock();
  fetching_[shard] = false;
  if (error) {
    cached_bytes_ -= ShardBytes(shard);
  } else {
    present_[shard] = true;
  }
  fetched_.notify_all();
  // A thread that waited for this download and finds the shard absent downloads it itself.
  if (error) std::rethrow_exception(error);
  return true;
}

std::string RemoteCache::Acquire(size_t shard) {
  CheckIndex(shard);
  std::unique_lock lock(mu_);
  last_use_[shard] = ++tick_;
  ahead_[shard] = false;
  Fill(shard, lock, true);
  return options_.dir + "/" + meta_.shards[shard].file;
}

std::string RemoteCache::Pin(size_t shard) {
  CheckIndex(shard);
  std::unique_lock lock(mu_);
  last_use_[shard] = ++tick_;
  ahead_[shard] = false;
  // Pinned before it is fetched: once present, no other thread may evict it.
  ++pins_[shard];
  try {
    Fill(shard, lock, true);
  } catch (...) {
    --pins_[shard];
    throw;
  }
  return options_.dir + "/" + meta_.shards[shard].file;
}

void RemoteCache::Unpin(size_t shard) {
  CheckIndex(shard);
  std::lock_guard lock(mu_);
  KEEL_CHECK(pins_[shard] > 0, "RemoteCache::Unpin of a shard that is not pinned");
  --pins_[shard];
}

bool RemoteCache::Prefetch(size_t shard) {
  CheckIndex(shard);
  std::unique_lock lock(mu_);
  last_use_[shard] = ++tick_;         // about to be read: the last one to evict
  if (pins_[shard] > 0) return true;  // mapped already: not ahead of the reader
  ahead_[shard] = true;
  return Fill(shard, lock, false);
}

RemoteCacheOptions DefaultRemoteCacheOptions(const std::string& url) {
  RemoteCacheOptions o;
  std::string root;
  if (const char* d = std::getenv("KEEL_CACHE_DIR"); d && *d) {
    root = d;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    root = std::string(h) + "/.cache/keel";
  } else {
    root = "/tmp/keel-cache";
  }
  o.dir = root + "/" + HashHex(XXH3_64bits(url.data(), url.size()));
  if (const char* b = std::getenv("KEEL_CACHE_BYTES"); b && *b) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(b, &end, 10);
    if (*end != '\0' || v == 0) {
      ThrowBadInput(std::string("KEEL_CACHE_BYTES=") + b + ": expected a positive byte count");
    }
    o.max_bytes = v;
  }
  return o;
}

}  // namespace keel::data

// RemoteShards: lazy mapping and fetch-ahead of an http(s) dataset's shards; see remote_shards.h.
#include "keel/data/remote_shards.h"

#include <algorithm>

#include "keel/core/error.h"
#include "keel/data/token_ids.h"

namespace keel::data::internal {
namespace {

RemoteCacheOptions WithCancel(RemoteCacheOptions o, const std::atomic<bool>* cancel) {
  o.http.cancel = cancel;
  return o;
}

}  // namespace

RemoteShards::RemoteShards(const std::string& url, RemoteShardsOptions options)
    : cache_(url, WithCancel(std::move(options.cache), &stop_)), ahead_(options.ahead) {
  slots_.resize(cache_.meta().shards.size());
  uint64_t largest = 0;
  for (size_t i = 0; i < slots_.size(); ++i) largest = std::max(largest, cache_.ShardBytes(i));
  ahead_reserve_ = uint64_t(std::max(ahead_, 0)) * largest;
  if (ahead_ > 0) ahead_thread_ = std::thread([this] { AheadLoop(); });
}

RemoteShards::~RemoteShards() {
  {
    std::lock_guard lock(ahead_mu_);
    stop_ = true;
  }
  ahead_cv_.notify_all();
  if (ahead_thread_.joinable()) ahead_thread_.join();
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].mapped) Unmap(i);
  }
}

size_t RemoteShards::mapped_shards() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const Slot& s : slots_) n += s.mapped;
  return n;
}

void RemoteShards::CheckIdsOnArrival(int vocab) {
  std::lock_guard lock(mu_);
  if (id_limit_ == 0 || vocab < id_limit_) id_limit_ = vocab;
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].mapped) continue;
    const ShardMeta& sm = cache_.meta().shards[i];
    CheckTokenIds(slots_[i].tokens.data(), sm.tokens, cache_.meta().token_bytes(), id_limit_,
                  url() + "/" + sm.file);
  }
}

void RemoteShards::Unmap(size_t i) {
  slots_[i].tokens = MappedFile();
  slots_[i].mapped = false;
  mapped_bytes_ -= cache_.ShardBytes(i);
  cache_.Unpin(i);
}

const uint8_t* RemoteShards::MapLocked(size_t i) {
  if (i >= slots_.size()) {
    ThrowRuntime(url() + ": shard " + std::to_string(i) + " of " + std::to_string(slots_.size()));
  }
  Slot& slot = slots_[i];
  slot.last_read = ++tick_;
  if (slot.mapped) return slot.tokens.data();
  // Mapped shards are pinned; make them leave room under the cap for this one and for the
  // fetch-ahead, least recently read first. With a cap too small for that, one stays mapped.
  const uint64_t need = cache_.ShardBytes(i);
  while (mapped_bytes_ > 0 && mapped_bytes_ + need + ahead_reserve_ > cache_.max_bytes()) {
    size_t lru = slots_.size();
    for (size_t j = 0; j < slots_.size(); ++j) {
      if (slots_[j].mapped &&
          (lru == slots_.size() || slots_[j].last_read < slots_[lru].last_read)) {
        lru = j;
      }
    }
    Unmap(lru);
  }
  const std::string path = cache_.Pin(i);
  try {
    slot.tokens = MappedFile::Open(path);
    const ShardMeta& sm = cache_.meta().shards[i];
    const uint64_t want = sm.tokens * cache_.meta().token_bytes();
    // Verified by hash when downloaded; a size mismatch means the file was changed since.
    if (slot.tokens.size() != want) {
      ThrowBadInput(path + ": expected " + std::to_string(want) + " bytes (" +
                    std::to_string(sm.tokens) + " tokens per " + url() + "/meta.json), found " +
                    std::to_string(slot.tokens.size()) + " (changed in the cache?)");
    }
    if (id_limit_ > 0) {
      CheckTokenIds(slot.tokens.data(), sm.tokens, cache_.meta().token_bytes(), id_limit_,
                    url() + "/" + sm.file);
    }
  } catch (...) {
    slot.tokens = MappedFile();
    cache_.Unpin(i);
    throw;
  }
  slot.mapped = true;
  mapped_bytes_ += need;
  QueueAhead(i);
  return slot.tokens.data();
}

void RemoteShards::QueueAhead(size_t i) {
  if (ahead_ <= 0) return;
  {
    std::lock_guard lock(ahead_mu_);
    // Only the newest guess matters: shards queued for an older position may never be read.
    ahead_queue_.clear();
    for (int k = 1; k <= ahead_ && size_t(k) < slots_.size(); ++k) {
      ahead_queue_.push_back((i + size_t(k)) % slots_.size());  // wraps into the next epoch
    }
  }
  ahead_cv_.notify_one();
}

void RemoteShards::AheadLoop() {
  while (true) {
    size_t i;
    {
      std::unique_lock lock(ahead_mu_);
      ahead_cv_.wait(lock, [this] { return stop_ || !ahead_queue_.empty(); });
      if (stop_) return;
      i = ahead_queue_.front();
      ahead_queue_.pop_front();
    }
    try {
      cache_.Prefetch(i);
    } catch (const std::exception&) {
      // Not reported here: if the shard is read, the reader's own download meets the problem
      // again and reports it, naming the URL, on the thread that can act on it.
    }
  }
}

}  // namespace keel::data::internal

// RemoteCache tests against a real HTTP server (python3 -m http.server) on 127.0.0.1: a cold
// fetch equals local reads, a warm cache downloads nothing, a small cap evicts LRU and still
// reads correctly, a corrupted shard is refused and not cached, a dead server is one clear error.
#include "keel/data/remote_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "data/served_dataset.h"
#include "data/temp_dir.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/data/dataset.h"
#include "keel/data/shard_writer.h"

namespace keel::data {
namespace {

namespace fs = std::filesystem;

class RemoteCacheTest : public ServedDataset {};

TEST_F(RemoteCacheTest, ColdFetchEqualsLocalAndWarmCacheDownloadsNothing) {
  {
    RemoteCache cache(server_->url("ds"), Options());
    ASSERT_EQ(cache.meta().shards.size(), meta_.shards.size());
    for (size_t i = 0; i < meta_.shards.size(); ++i) ExpectShardEqual(cache, i);
    EXPECT_EQ(cache.downloads(), 2 * meta_.shards.size());  // .bin and .idx each
    EXPECT_EQ(cache.evictions(), 0u);
    // The cached folder is itself a dataset, token for token the local one.
    TokenDataset a = TokenDataset::Open(local_), b = TokenDataset::Open(cache.dir());
    ASSERT_EQ(a.size(), b.size());
    std::vector<int32_t> x(a.size()), y(b.size());
    a.Read(0, a.size(), x.data());
    b.Read(0, b.size(), y.data());
    EXPECT_EQ(x, y);
  }
  RemoteCache warm(server_->url("ds"), Options());
  for (size_t i = 0; i < meta_.shards.size(); ++i) ExpectShardEqual(warm, i);
  EXPECT_EQ(warm.downloads(), 0u);
}

TEST_F(RemoteCacheTest, SmallCapEvictsLeastRecentlyUsed) {
  const uint64_t cap = 2 * RemoteCache(server_->url("ds"), Options()).ShardBytes(0) + 16;
  RemoteCache cache(server_->url("ds"), Options(cap));
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < meta_.shards.size(); ++i) {
      ExpectShardEqual(cache, i);
      EXPECT_LE(cache.cached_bytes(), std::max(cap, cache.ShardBytes(i)));
      EXPECT_TRUE(fs::exists(cache.dir() + "/" + meta_.shards[i].file));  // never the one in use
    }
  }
  EXPECT_GT(cache.evictions(), 0u);
  // Shard 0 was the least recently used when later shards came in: it is gone, the last is not.
  EXPECT_FALSE(fs::exists(cache.dir() + "/" + meta_.shards[0].file));
  EXPECT_TRUE(fs::exists(cache.dir() + "/" + meta_.shards.back().file));
  const uint64_t before = cache.downloads();
  ExpectShardEqual(cache, meta_.shards.size() - 1);  // most recent: still cached
  EXPECT_EQ(cache.downloads(), before);
}

TEST_F(RemoteCacheTest, ShardRemovedByAnotherProcessIsFetchedAgain) {
  RemoteCache cache(server_->url("ds"), Options());
  ExpectShardEqual(cache, 0);
  const uint64_t before = cache.downloads();
  // What a rank sharing the folder does when it evicts shard 0 for its own count of the cap.
  fs::remove(cache.dir() + "/" + meta_.shards[0].file);
  ExpectShardEqual(cache, 0);
  EXPECT_EQ(cache.downloads(), before + 2);
  EXPECT_EQ(cache.cached_bytes(), cache.ShardBytes(0));
}

TEST_F(RemoteCacheTest, CorruptShardIsRefusedAndNotCached) {
  const std::string bin = local_ + "/" + meta_.shards[1].file;
  std::string bytes = ReadWholeFile(bin);
  bytes[3] ^= 0x5a;
  std::ofstream(bin, std::ios::binary | std::ios::trunc) << bytes;
  RemoteCache cache(server_->url("ds"), Options());
  ExpectShardEqual(cache, 0);
  try {
    cache.Acquire(1);
    ADD_FAILURE() << "expected a hash mismatch";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(what.find(server_->url("ds/" + meta_.shards[1].file)), std::string::npos) << what;
    EXPECT_NE(what.find(meta_.shards[1].xxh3), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  for (const auto& entry : fs::directory_iterator(cache.dir())) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find("shard_00001"), std::string::npos) << "left in the cache: " << name;
  }
}

TEST_F(RemoteCacheTest, DeadServerIsOneClearErrorAfterRetries) {
  RemoteCache cache(server_->url("ds"), Options());
  ExpectShardEqual(cache, 0);
  server_->Stop();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    cache.Acquire(1);
    ADD_FAILURE() << "expected a download error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(server_->url("ds/")), std::string::npos) << what;
    EXPECT_NE(what.find("after 3 tries"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  // Two backoff waits, 0.05 s and 0.1 s, between three refused connections.
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(140));
  EXPECT_FALSE(fs::exists(cache.dir() + "/" + meta_.shards[1].index));
}

TEST_F(RemoteCacheTest, CancelStopsADownloadFromAHungServer) {
  server_->Pause();
  std::atomic<bool> cancel = false;
  HttpOptions o;
  o.stall_timeout_s = 60;  // without the cancel, this download would wait a minute
  o.cancel = &cancel;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  std::thread t([&] {
    try {
      HttpDownload(server_->url("ds/meta.json"), cache_ / "meta.part", o);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  cancel = true;
  t.join();
  server_->Resume();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_NE(error.find(server_->url("ds/meta.json") + ": download cancelled"), std::string::npos)
      << error;
  EXPECT_FALSE(fs::exists(cache_ / "meta.part"));
}

TEST_F(RemoteCacheTest, MissingFileIsBadInputWithoutRetries) {
  try {
    RemoteCache cache(server_->url("nope"), Options());
    ADD_FAILURE() << "expected HTTP 404";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find(server_->url("nope/meta.json")), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("404"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel::data

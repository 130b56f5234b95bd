// Remote datasets read lazily (RemoteShards, and TokenDataset over a URL) against a real HTTP
// server on 127.0.0.1: opening fetches meta.json only, shards come on first touch, the next ones
// are fetched ahead, a cache cap smaller than the dataset still reads every token right, and
// readers on several threads see the local bytes.
#include "keel/data/remote_shards.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "data/run_keel.h"
#include "data/served_dataset.h"
#include "keel/core/error.h"
#include "keel/data/dataset.h"

namespace keel::data {
namespace {

namespace fs = std::filesystem;
using internal::RemoteShards;

class RemoteShardsTest : public ServedDataset {
 protected:
  internal::RemoteShardsOptions ShardsOptions(uint64_t cap, int ahead) {
    return {.cache = Options(cap), .ahead = ahead};
  }
  std::string Bytes(RemoteShards& r, size_t i) {
    std::string out;
    const size_t n = meta_.shards[i].tokens * meta_.token_bytes();
    r.WithShard(i, [&](const uint8_t* p) { out.assign(reinterpret_cast<const char*>(p), n); });
    return out;
  }
  std::string LocalBytes(size_t i) { return ReadWholeFile(local_ + "/" + meta_.shards[i].file); }
  size_t ShardFilesInCache() {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(cache_.path())) {
      n += e.path().filename().string().starts_with("shard_");
    }
    return n;
  }
  uint64_t ShardBytes() {  // the largest shard, .bin + .idx
    uint64_t m = 0;
    for (const auto& s : meta_.shards) {
      m = std::max<uint64_t>(m, s.tokens * meta_.token_bytes() + (s.documents + 1) * 8);
    }
    return m;
  }
};

std::vector<int32_t> ReadAll(const TokenDataset& ds) {
  std::vector<int32_t> v(ds.size());
  ds.Read(0, v.size(), v.data());
  return v;
}

TEST_F(RemoteShardsTest, TokenDatasetOpensAUrlLazily) {
  ::setenv("KEEL_CACHE_DIR", cache_.path().c_str(), 1);
  ::unsetenv("KEEL_CACHE_BYTES");
  TokenDataset local = TokenDataset::Open(local_);
  TokenDataset remote = TokenDataset::Open(server_->url("ds"));
  EXPECT_EQ(remote.path(), server_->url("ds"));
  EXPECT_EQ(remote.size(), local.size());
  EXPECT_EQ(remote.vocab_size(), local.vocab_size());
  // Nothing but meta.json until a read: the default cache folder is one level down, by URL hash.
  size_t shard_files = 0;
  for (const auto& e : fs::recursive_directory_iterator(cache_.path())) {
    shard_files += e.path().filename().string().starts_with("shard_");
  }
  EXPECT_EQ(shard_files, 0u);
  EXPECT_EQ(ReadAll(remote), ReadAll(local));
  remote.CheckIds(remote.vocab_size());
  ::unsetenv("KEEL_CACHE_DIR");
}

TEST_F(RemoteShardsTest, IdsAreCheckedAsEachShardArrivesNotAllAtOnce) {
  ::setenv("KEEL_CACHE_DIR", cache_.path().c_str(), 1);
  TokenDataset remote = TokenDataset::Open(server_->url("ds"));
  remote.CheckIds(remote.vocab_size());  // fine, and downloads nothing
  size_t shard_files = 0;
  for (const auto& e : fs::recursive_directory_iterator(cache_.path())) {
    shard_files += e.path().filename().string().starts_with("shard_");
  }
  EXPECT_EQ(shard_files, 0u);
  // A model with a smaller vocabulary than the data: the first read of a shard reports it.
  remote.CheckIds(500);
  std::vector<int32_t> window(16);
  try {
    remote.Read(0, window.size(), window.data());
    ADD_FAILURE() << "expected an id error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    const std::string what = e.what();
    EXPECT_NE(what.find(server_->url("ds/shard_00000.bin") + ": token "), std::string::npos)
        << what;
    EXPECT_NE(what.find("expected an id < 500"), std::string::npos) << what;
  }
  ::unsetenv("KEEL_CACHE_DIR");
}

TEST_F(RemoteShardsTest, FetchesAheadOfTheReader) {
  RemoteShards r(server_->url("ds"), ShardsOptions(uint64_t(1) << 30, 2));
  EXPECT_EQ(ShardFilesInCache(), 0u);
  EXPECT_EQ(Bytes(r, 0), LocalBytes(0));
  // Shards 1 and 2 arrive without being asked for.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!(r.cache().cached(1) && r.cache().cached(2)) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(r.cache().cached(1) && r.cache().cached(2));
  EXPECT_FALSE(r.cache().cached(4));
  // With the server gone they are still there to read; a shard that was not fetched ahead is a
  // clear error naming its URL.
  server_->Stop();
  EXPECT_EQ(Bytes(r, 1), LocalBytes(1));
  EXPECT_EQ(Bytes(r, 2), LocalBytes(2));
  const size_t last = meta_.shards.size() - 1;
  try {
    Bytes(r, last);
    ADD_FAILURE() << "expected a download error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(server_->url("ds/shard_")), std::string::npos) << e.what();
  }
}

TEST_F(RemoteShardsTest, CapSmallerThanTheDatasetReadsInOrderDownloadingEachShardOnce) {
  // Room for four shards: two mapped, two fetched ahead.
  const uint64_t cap = 4 * ShardBytes();
  const size_t n = meta_.shards.size();
  ASSERT_GT(n, 4u);
  RemoteShards r(server_->url("ds"), ShardsOptions(cap, 2));
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(Bytes(r, i), LocalBytes(i)) << "shard " << i;
    EXPECT_LE(r.cache().cached_bytes(), cap) << "after shard " << i;
    EXPECT_LE(r.mapped_shards(), 2u);
  }
  // Let the last fetch-ahead (wrapping to shards 0 and 1) settle before counting.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GT(r.cache().evictions(), 0u);
  // Every shard once, plus at most the two wrapped fetch-aheads (shards 0 and 1 came back).
  EXPECT_GE(r.cache().downloads(), 2 * n);
  EXPECT_LE(r.cache().downloads(), 2 * (n + 2));
}

TEST_F(RemoteShardsTest, ThreadsReadingRandomWindowsUnderASmallCapSeeTheLocalTokens) {
  ::setenv("KEEL_CACHE_DIR", cache_.path().c_str(), 1);
  ::setenv("KEEL_CACHE_BYTES", std::to_string(3 * ShardBytes()).c_str(), 1);
  TokenDataset local = TokenDataset::Open(local_);
  TokenDataset remote = TokenDataset::Open(server_->url("ds"));
  const std::vector<int32_t> want = ReadAll(local);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(3, 0);
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<int32_t> got(65);  // windows that often cross a shard boundary
      for (int k = 0; k < 60; ++k) {
        const size_t start = rng() % (want.size() - got.size());
        remote.Read(start, got.size(), got.data());
        mismatches[t] += std::memcmp(got.data(), want.data() + start, got.size() * 4) != 0;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(3, 0));
  ::unsetenv("KEEL_CACHE_BYTES");
  ::unsetenv("KEEL_CACHE_DIR");
}

TEST_F(RemoteShardsTest, InspectAndVerifyAUrlThroughKeel) {
  ASSERT_TRUE(fs::exists(KEEL_BINARY)) << "keel binary not built";
  ::setenv("KEEL_CACHE_DIR", cache_.path().c_str(), 1);
  const std::string url = server_->url("ds");
  KeelResult r = Keel("data inspect " + url);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(url + ": keel-tokens v1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(std::to_string(meta_.shards.size()) + " shards"), std::string::npos)
      << r.output;
  r = Keel("data verify " + url);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ok: " + url + ": " + std::to_string(meta_.shards.size()) + " shards"),
            std::string::npos)
      << r.output;
  // A shard corrupted on the server, seen by a cold cache: exit 2, one line naming its URL.
  const std::string bin = local_ + "/" + meta_.shards[2].file;
  std::string bytes = ReadWholeFile(bin);
  bytes[1] ^= 0x21;
  std::ofstream(bin, std::ios::binary | std::ios::trunc) << bytes;
  TempDir cold;
  ::setenv("KEEL_CACHE_DIR", cold.path().c_str(), 1);
  r = Keel("data verify " + url);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find(url + "/" + meta_.shards[2].file + ": xxh3"), std::string::npos)
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  ::unsetenv("KEEL_CACHE_DIR");
}

}  // namespace
}  // namespace keel::data

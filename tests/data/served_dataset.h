// A test fixture for remote datasets: a small keel-tokens dataset (vocab 1000, 6+ shards) in
// root_/ds, served by a real HTTP server on 127.0.0.1, and an empty cache folder.
//
//   class MyTest : public ServedDataset {};
//   TEST_F(MyTest, X) { RemoteCache cache(server_->url("ds"), Options()); ... }
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "data/http_server.h"
#include "data/temp_dir.h"
#include "keel/core/file_util.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/remote_cache.h"
#include "keel/data/shard_writer.h"

namespace keel::data {

class ServedDataset : public ::testing::Test {
 protected:
  void SetUp() override {
    // A proxy from the environment must not see loopback requests.
    ::setenv("no_proxy", "127.0.0.1,localhost", 1);
    ::setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    std::mt19937 rng(7);
    ShardWriter w(local_, {.vocab_size = 1000, .eos_id = 999, .shard_tokens = 300});
    for (int d = 0; d < 80; ++d) {
      std::vector<int32_t> doc(rng() % 60 + 1);
      for (auto& t : doc) t = int32_t(rng() % 999);
      doc.push_back(999);
      w.AddDocument(doc);
    }
    meta_ = w.Finish();
    ASSERT_GE(meta_.shards.size(), 6u);
    server_ = std::make_unique<HttpServer>(root_.path());
    ASSERT_TRUE(server_->up());
  }

  RemoteCacheOptions Options(uint64_t cap = uint64_t(1) << 30) {
    RemoteCacheOptions o;
    o.dir = cache_.path();
    o.max_bytes = cap;
    o.http.backoff_s = 0.05;  // keeps the failure tests fast; the schedule is the same
    o.http.connect_timeout_s = 2;
    o.http.stall_timeout_s = 5;
    return o;
  }

  // Every shard's tokens via the cache equal the local file's bytes.
  void ExpectShardEqual(RemoteCache& cache, size_t i) {
    const std::string got = ReadWholeFile(cache.Acquire(i));
    EXPECT_EQ(got, ReadWholeFile(local_ + "/" + meta_.shards[i].file)) << "shard " << i;
  }

  TempDir root_;  // served
  TempDir cache_;
  std::string local_ = root_ / "ds";
  DatasetMeta meta_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace keel::data

// RemoteCache tests against a real HTTP server (python3 -m http.server) on 127.0.0.1: a cold
// fetch equals local reads, a warm cache downloads nothing, a small cap evicts LRU and still
// reads correctly, a corrupted shard is refused and not cached, a dead server is one clear error.
#include "keel/data/remote_cache.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "data/temp_dir.h"
#include "keel/core/error.h"
#include "keel/data/dataset.h"
#include "keel/data/file_util.h"
#include "keel/data/shard_writer.h"

namespace keel::data {
namespace {

namespace fs = std::filesystem;

// A free loopback port: bind to port 0 and let the kernel choose.
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool Answers(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// python3 -m http.server serving DIR on 127.0.0.1 only, killed at scope exit.
class HttpServer {
 public:
  explicit HttpServer(const std::string& dir) : port_(FreePort()) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int null = ::open("/dev/null", O_WRONLY);  // it logs every request to stderr
      ::dup2(null, 1);
      ::dup2(null, 2);
      const std::string port = std::to_string(port_);
      ::execl("/usr/bin/python3", "python3", "-m", "http.server", port.c_str(), "--bind",
              "127.0.0.1", "--directory", dir.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !Answers(port_); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  ~HttpServer() { Stop(); }
  void Stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + path;
  }
  bool up() const { return Answers(port_); }

 private:
  int port_;
  pid_t pid_ = -1;
};

class RemoteCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A proxy from the environment must not see loopback requests.
    ::setenv("no_proxy", "127.0.0.1,localhost", 1);
    ::setenv("NO_PROXY", "127.0.0.1,localhost", 1);
    std::mt19937 rng(7);
    ShardWriter w(local_, {.vocab_size = 1000, .eos_id = 999, .shard_tokens = 300});
    for (int d = 0; d < 40; ++d) {
      std::vector<int32_t> doc(rng() % 60 + 1);
      for (auto& t : doc) t = int32_t(rng() % 999);
      doc.push_back(999);
      w.AddDocument(doc);
    }
    meta_ = w.Finish();
    ASSERT_GE(meta_.shards.size(), 4u);
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

TEST_F(RemoteCacheTest, TokenDatasetOpensAUrlThroughTheCache) {
  ::setenv("KEEL_CACHE_DIR", cache_.path().c_str(), 1);
  ::unsetenv("KEEL_CACHE_BYTES");
  TokenDataset a = TokenDataset::Open(local_);
  TokenDataset b = TokenDataset::Open(server_->url("ds"));
  EXPECT_EQ(b.path(), server_->url("ds"));
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  std::vector<int32_t> x(a.size()), y(b.size());
  a.Read(0, a.size(), x.data());
  b.Read(0, b.size(), y.data());
  EXPECT_EQ(x, y);

  ::setenv("KEEL_CACHE_BYTES", "64", 1);  // smaller than the dataset: a clear error, not a crash
  try {
    TokenDataset::Open(server_->url("ds"));
    ADD_FAILURE() << "expected the cap to be too small";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("KEEL_CACHE_BYTES"), std::string::npos) << e.what();
  }
  ::unsetenv("KEEL_CACHE_BYTES");
  ::unsetenv("KEEL_CACHE_DIR");
}

}  // namespace
}  // namespace keel::data

// A run's check of its shards against meta.json: a flipped byte that still decodes to valid ids
// is found before the first step for small data, and by the background thread for large data.
#include "keel/train/shard_check.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "keel/core/error.h"
#include "keel/data/shard_writer.h"

namespace keel::train {
namespace {

namespace fs = std::filesystem;

std::string SmallDataset(const fs::path& dir) {
  fs::remove_all(dir);
  data::ShardWriter w(dir.string(), {.vocab_size = 50257, .eos_id = 50256, .shard_tokens = 40});
  for (int d = 0; d < 8; ++d) {
    std::vector<int32_t> doc(30, 100 + d);
    doc.push_back(50256);
    w.AddDocument(doc);
  }
  w.Finish();
  return dir.string();
}

// Token 100 → 101 in the second shard: still a valid id.
void FlipALowBit(const std::string& dir) {
  std::fstream f(dir + "/shard_00001.bin", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(2);
  char c = 0;
  f.seekg(2);
  f.read(&c, 1);
  c ^= 1;
  f.seekp(2);
  f.write(&c, 1);
}

TEST(ShardCheck, SmallDataIsCheckedBeforeTheRunStarts) {
  const std::string dir = SmallDataset(fs::temp_directory_path() / "keel_shard_check_small");
  EXPECT_NO_THROW(ShardCheck({dir, "", "/not/a/dataset.u16"}));
  FlipALowBit(dir);
  try {
    ShardCheck check({dir});
    ADD_FAILURE() << "a corrupt shard passed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find(dir + "/shard_00001.bin: xxh3"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(ShardCheck, LargeDataIsCheckedInTheBackground) {
  const std::string dir = SmallDataset(fs::temp_directory_path() / "keel_shard_check_large");
  {
    ShardCheck clean({dir}, /*sync_bytes=*/0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_NO_THROW(clean.ThrowIfFailed());
  }
  FlipALowBit(dir);
  ShardCheck check({dir}, /*sync_bytes=*/0);  // returns at once: the thread hashes
  std::string found;
  for (int i = 0; i < 100 && found.empty(); ++i) {
    try {
      check.ThrowIfFailed();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } catch (const Error& e) {
      found = e.what();
    }
  }
  EXPECT_NE(found.find("shard_00001.bin: xxh3"), std::string::npos) << found;
  EXPECT_NE(found.find("background check"), std::string::npos) << found;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel::train

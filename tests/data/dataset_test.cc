// Dataset tests: ShardWriter -> TokenDataset round trip across shards, flat files, and clear
// errors for truncated shards, bad meta.json and interrupted writes; VerifyDataset.
#include "keel/data/dataset.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "data/temp_dir.h"
#include "keel/core/error.h"
#include "keel/data/shard_writer.h"
#include "keel/data/verify.h"

namespace keel::data {
namespace {

// Runs `fn`, expects a keel::Error with the bad-input code whose message holds every needle.
template <typename Fn>
void ExpectBadInput(Fn fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected a keel::Error";
  } catch (const keel::Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
  }
}

std::vector<std::vector<int32_t>> RandomDocs(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    d.resize(rng() % 50);
    for (auto& t : d) t = int32_t(rng() % uint32_t(vocab - 1));
    d.push_back(vocab - 1);  // eos
  }
  return docs;
}

DatasetMeta WriteDocs(const std::string& dir, const std::vector<std::vector<int32_t>>& docs,
                      ShardWriterOptions o) {
  ShardWriter w(dir, o);
  for (const auto& d : docs) w.AddDocument(d);
  return w.Finish();
}

TEST(TokenDataset, WriterRoundTripAcrossShards) {
  TempDir tmp;
  auto docs = RandomDocs(200, 50257, 1);
  ShardWriterOptions o;
  o.shard_tokens = 500;
  DatasetMeta meta = WriteDocs(tmp / "ds", docs, o);
  EXPECT_GT(meta.shards.size(), 5u);
  EXPECT_EQ(meta.dtype, "uint16");
  EXPECT_EQ(meta.documents(), 200u);

  std::vector<int32_t> all;
  for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
  auto ds = TokenDataset::Open(tmp / "ds");
  ASSERT_EQ(ds.size(), all.size());
  EXPECT_EQ(ds.vocab_size(), 50257);
  EXPECT_EQ(ds.eos_id(), 50256);
  std::vector<int32_t> got(all.size());
  ds.Read(0, all.size(), got.data());
  EXPECT_EQ(got, all);
  // Windows that start anywhere and cross shard boundaries.
  std::mt19937 rng(2);
  for (int i = 0; i < 200; ++i) {
    size_t n = rng() % 1200, start = rng() % (all.size() - n + 1);
    std::vector<int32_t> w(n);
    ds.Read(start, n, w.data());
    ASSERT_TRUE(std::equal(w.begin(), w.end(), all.begin() + ptrdiff_t(start)));
  }
  ds.CheckIds(50257);
  VerifySummary v = VerifyDataset(tmp / "ds");
  EXPECT_EQ(v.tokens, all.size());
  EXPECT_EQ(v.documents, 200u);
}

TEST(TokenDataset, WideVocabUsesUint32) {
  TempDir tmp;
  ShardWriterOptions o;
  o.vocab_size = 100000;
  o.eos_id = 99999;
  auto docs = RandomDocs(20, 100000, 3);
  EXPECT_EQ(WriteDocs(tmp / "ds", docs, o).dtype, "uint32");
  auto ds = TokenDataset::Open(tmp / "ds");
  std::vector<int32_t> got(ds.size());
  ds.Read(0, got.size(), got.data());
  EXPECT_EQ(got.back(), 99999);
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + ptrdiff_t(docs[0].size())), docs[0]);
}

TEST(TokenDataset, EmptyDatasetOpens) {
  TempDir tmp;
  WriteDocs(tmp / "ds", {}, {});
  EXPECT_EQ(TokenDataset::Open(tmp / "ds").size(), 0u);
}

TEST(TokenDataset, FlatFile) {
  TempDir tmp;
  std::vector<uint16_t> toks(1000);
  std::iota(toks.begin(), toks.end(), uint16_t(0));
  std::ofstream(tmp / "flat.u16", std::ios::binary)
      .write(reinterpret_cast<const char*>(toks.data()), std::streamsize(toks.size() * 2));
  auto ds = TokenDataset::Open(tmp / "flat.u16");
  ASSERT_EQ(ds.size(), 1000u);
  std::vector<int32_t> w(10);
  ds.Read(990, 10, w.data());
  EXPECT_EQ(w[9], 999);
  EXPECT_EQ(ds.vocab_size(), 50257);

  std::ofstream(tmp / "odd.u16", std::ios::binary).write("abc", 3);
  ExpectBadInput([&] { TokenDataset::Open(tmp / "odd.u16"); }, {tmp / "odd.u16", "even"});
}

TEST(TokenDataset, TruncatedShardIsAClearError) {
  TempDir tmp;
  ShardWriterOptions o;
  o.shard_tokens = 100;
  WriteDocs(tmp / "ds", RandomDocs(30, 50257, 4), o);
  std::filesystem::resize_file(tmp / "ds/shard_00001.bin", 10);
  ExpectBadInput([&] { TokenDataset::Open(tmp / "ds"); },
                 {tmp / "ds/shard_00001.bin", "expected", "truncated"});
}

TEST(TokenDataset, BadMetaJsonIsAClearError) {
  TempDir tmp;
  WriteDocs(tmp / "ds", RandomDocs(5, 50257, 5), {});
  const std::string meta = tmp / "ds/meta.json";
  std::ofstream(meta) << "{not json";
  ExpectBadInput([&] { TokenDataset::Open(tmp / "ds"); }, {meta, "expected JSON"});
  std::ofstream(meta) << R"({"format": "other", "version": 1})";
  ExpectBadInput([&] { TokenDataset::Open(tmp / "ds"); }, {meta, "format", "keel-tokens"});
  std::ofstream(meta) << R"({"format": "keel-tokens", "version": 7})";
  ExpectBadInput([&] { TokenDataset::Open(tmp / "ds"); }, {meta, "version"});
  std::ofstream(meta) << R"({"format": "keel-tokens", "version": 1, "tokenizer": "gpt2",
      "vocab_size": "big"})";
  ExpectBadInput([&] { TokenDataset::Open(tmp / "ds"); }, {meta, "vocab_size", "integer"});
  std::ofstream(meta) << R"({"format": "keel-tokens", "version": 1, "tokenizer": "gpt2",
      "vocab_size": 50257, "eos_id": 50256, "dtype": "uint16", "shards": [{"file": "../x",
      "index": "a.idx", "tokens": 1, "documents": 1, "xxh3": "", "index_xxh3": ""}]})";
  ExpectBadInput([&] { TokenDataset::Open(tmp / "ds"); }, {meta, "shards[0].file"});
}

TEST(TokenDataset, MissingPathIsAClearError) {
  ExpectBadInput([] { TokenDataset::Open("/nonexistent/ds"); }, {"/nonexistent/ds", "not found"});
}

TEST(ShardWriter, InterruptedWriteIsNotADataset) {
  TempDir tmp;
  {
    ShardWriterOptions o;
    o.shard_tokens = 50;
    ShardWriter w(tmp / "ds", o);
    for (const auto& d : RandomDocs(40, 50257, 6)) w.AddDocument(d);
    // destroyed without Finish(), as when prepare fails midway
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "ds/meta.json"));
  ExpectBadInput([&] { TokenDataset::Open(tmp / "ds"); }, {tmp / "ds/meta.json", "interrupted"});
  for (const auto& e : std::filesystem::directory_iterator(tmp / "ds")) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST(ShardWriter, RewriteRemovesTheOldDataset) {
  TempDir tmp;
  ShardWriterOptions o;
  o.shard_tokens = 50;
  WriteDocs(tmp / "ds", RandomDocs(40, 50257, 7), o);
  WriteDocs(tmp / "ds", RandomDocs(2, 50257, 8), o);
  EXPECT_FALSE(std::filesystem::exists(tmp / "ds/shard_00005.bin"));
  VerifyDataset(tmp / "ds");
}

TEST(ShardWriter, RejectsIdsOutsideTheVocab) {
  TempDir tmp;
  ShardWriter w(tmp / "ds", {});
  std::vector<int32_t> bad = {1, 2, 50257};
  ExpectBadInput([&] { w.AddDocument(bad); }, {"50257", "expected an id"});
}

TEST(VerifyDataset, DetectsFlippedBytesAndBadIds) {
  TempDir tmp;
  WriteDocs(tmp / "ds", RandomDocs(10, 50257, 9), {});
  {
    std::fstream f(tmp / "ds/shard_00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    f.put('\x7f');
  }
  ExpectBadInput([&] { VerifyDataset(tmp / "ds"); }, {tmp / "ds/shard_00000.bin", "xxh3"});

  std::vector<uint16_t> toks = {1, 2, 60000};
  std::ofstream(tmp / "flat.u16", std::ios::binary)
      .write(reinterpret_cast<const char*>(toks.data()), 6);
  ExpectBadInput([&] { VerifyDataset(tmp / "flat.u16"); }, {"60000", "offset 2"});
}

}  // namespace
}  // namespace keel::data

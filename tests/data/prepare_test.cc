// Prepare tests: brown.jsonl gives exactly tiktoken's ids plus eos per document; any worker count
// gives identical bytes; filters, split, text chunking, --on-error skip, --nfc. Bad inputs (a
// failed prepare leaves no dataset) are in bad_input_test.cc.
#include "keel/data/prepare.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/compression.h"
#include "data/temp_dir.h"
#include "keel/core/error.h"
#include "keel/data/dataset.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/tokenizer.h"
#include "keel/data/verify.h"

namespace keel::data {
namespace {

const std::string kBrown = std::string(KEEL_SHARED_DATA) + "/brown/brown.jsonl";

PrepareOptions Options(const TempDir& tmp, const std::string& out) {
  PrepareOptions o;
  o.inputs = {kBrown};
  o.out = tmp / out;
  o.tokenizer_dir = std::string(KEEL_ASSET_DIR) + "/gpt2";
  o.progress = false;
  o.shard_tokens = 200000;
  return o;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> ReadAll(const std::string& path) {
  auto ds = TokenDataset::Open(path);
  std::vector<int32_t> v(ds.size());
  ds.Read(0, v.size(), v.data());
  return v;
}

TEST(Prepare, BrownIsTiktokenIdsWithEos) {
  TempDir tmp;
  PrepareOptions o = Options(tmp, "out");
  o.val_fraction = 0;
  PrepareSummary s = Prepare(o);
  EXPECT_EQ(s.documents_read, 500u);
  EXPECT_EQ(s.train_documents, 500u);
  EXPECT_EQ(s.train_tokens, 1299167u + 500u);
  EXPECT_FALSE(std::filesystem::exists(tmp / "out/val/meta.json"));

  const std::string ref = Slurp(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.u16");
  std::istringstream counts(Slurp(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.counts"));
  std::vector<int32_t> want;
  size_t pos = 0;
  for (size_t n; counts >> n;) {
    for (size_t i = 0; i < n; ++i, ++pos) {
      uint16_t v;
      std::memcpy(&v, ref.data() + 2 * pos, 2);
      want.push_back(v);
    }
    want.push_back(50256);
  }
  EXPECT_EQ(ReadAll(tmp / "out/train"), want);
  EXPECT_EQ(VerifyDataset(tmp / "out/train").documents, 500u);
}

TEST(Prepare, WorkerCountDoesNotChangeTheOutput) {
  TempDir tmp;
  PrepareOptions o1 = Options(tmp, "w1");
  o1.workers = 1;
  PrepareOptions o3 = Options(tmp, "w3");
  o3.workers = 3;
  Prepare(o1);
  Prepare(o3);
  size_t compared = 0;
  for (const std::string split : {"train", "val"}) {
    for (const auto& e : std::filesystem::directory_iterator(tmp / ("w1/" + split))) {
      const std::string name = e.path().filename().string();
      EXPECT_EQ(Slurp(e.path().string()), Slurp(tmp / ("w3/" + split + "/" + name)))
          << split << "/" << name;
      ++compared;
    }
  }
  EXPECT_GE(compared, 2u * 3 + 4);  // meta.json + at least one shard pair each, train has several
}

TEST(Prepare, SplitFiltersAndDedup) {
  TempDir tmp;
  {
    std::ofstream f(tmp / "a.jsonl");
    f << R"({"body": "short"})"
      << "\n\n";
    for (int i = 0; i < 50; ++i)
      f << R"({"body": "a document that is long enough )" << i << "\"}\n";
    f << R"({"body": "a document that is long enough 7"})"
      << "\n";  // duplicate
  }
  PrepareOptions o = Options(tmp, "out");
  o.inputs = {tmp / "a.jsonl"};
  o.field = "body";
  o.min_chars = 10;
  o.dedup = true;
  o.val_fraction = 0.3;
  PrepareSummary s = Prepare(o);
  EXPECT_EQ(s.documents_read, 52u);
  EXPECT_EQ(s.dropped_short, 1u);
  EXPECT_EQ(s.dropped_duplicate, 1u);
  EXPECT_EQ(s.train_documents + s.val_documents, 50u);
  EXPECT_GT(s.val_documents, 5u);
  EXPECT_GT(s.train_documents, 20u);
  EXPECT_EQ(TokenDataset::Open(tmp / "out/val").size(), s.val_tokens);
}

TEST(Prepare, ChunkedTextGivesTheSameIdsAsWholeText) {
  TempDir tmp;
  // A text file with long lines, blank lines, indentation and unicode; cut into ~100-byte pieces.
  std::string text;
  for (int i = 0; i < 300; ++i) {
    text += "Line " + std::to_string(i) + " has words, numbers 12345 and caf\xc3\xa9.\n";
    if (i % 7 == 0) text += "\n  indented\n\n\n";
    if (i % 11 == 0) text += "\t\xe2\x80\x83spaces \n";
  }
  std::filesystem::create_directories(tmp / "in/sub");
  std::ofstream(tmp / "in/sub/t.txt") << text;
  std::ofstream(tmp / "in/ignored.bin") << "not text";
  PrepareOptions o = Options(tmp, "out");
  o.inputs = {tmp / "in"};
  o.val_fraction = 0;
  o.text_chunk_bytes = 100;
  PrepareSummary s = Prepare(o);
  EXPECT_EQ(s.files, 1u);
  EXPECT_EQ(s.train_documents, 1u);
  auto tok = Tokenizer::LoadGpt2(o.tokenizer_dir);
  auto want = tok.Encode(text);
  want.push_back(50256);
  EXPECT_EQ(ReadAll(tmp / "out/train"), want);
}

TEST(Prepare, OnErrorSkipCountsBadLinesInSummaryAndMeta) {
  TempDir tmp;
  {
    std::ofstream f(tmp / "mixed.jsonl");
    for (int i = 0; i < 40; ++i) {
      f << R"({"text": "good document )" << i << "\"}\n";
      if (i == 3)
        f << R"({"text": "unterminated)"
          << "\n";
      if (i == 10)
        f << R"(["text", "an array"])"
          << "\n";
      if (i == 20)
        f << R"({"body": "wrong field"})"
          << "\n";
      if (i == 30)
        f << R"({"text": 42})"
          << "\n";
    }
  }
  PrepareOptions o = Options(tmp, "out");
  o.inputs = {tmp / "mixed.jsonl"};
  o.workers = 2;
  o.val_fraction = 0.25;
  o.on_error = PrepareOnError::kSkip;
  PrepareSummary s = Prepare(o);
  EXPECT_EQ(s.skipped_lines, 4u);
  EXPECT_EQ(s.documents_read, 40u);
  EXPECT_EQ(s.train_documents + s.val_documents, 40u);
  EXPECT_NE(s.first_skipped.find(tmp / "mixed.jsonl:5: "), std::string::npos) << s.first_skipped;
  EXPECT_NE(s.first_skipped.find("invalid JSON"), std::string::npos) << s.first_skipped;
  for (const std::string split : {"train", "val"}) {
    const DatasetMeta m = ReadDatasetMeta(tmp / ("out/" + split));
    ASSERT_TRUE(m.prepare.has_value()) << split;
    EXPECT_EQ(m.prepare->on_error, "skip");
    EXPECT_EQ(m.prepare->skipped_lines, 4u);
    EXPECT_FALSE(m.prepare->nfc);
  }
  // The good lines give what they give alone: skipping a line changes nothing else.
  {
    std::ofstream f(tmp / "clean.jsonl");
    for (int i = 0; i < 40; ++i) f << R"({"text": "good document )" << i << "\"}\n";
  }
  PrepareOptions c = Options(tmp, "clean");
  c.inputs = {tmp / "clean.jsonl"};
  c.val_fraction = 0;
  o.out = tmp / "skip0";
  o.val_fraction = 0;
  EXPECT_EQ(Prepare(o).skipped_lines, 4u);
  Prepare(c);
  EXPECT_EQ(ReadAll(tmp / "skip0/train"), ReadAll(tmp / "clean/train"));
}

TEST(Prepare, NfcComposesBeforeTokenizingAndDedup) {
  TempDir tmp;
  const std::string decomposed = "cafe\xcc\x81 au lait";  // e + U+0301
  const std::string composed = "caf\xc3\xa9 au lait";     // U+00E9
  {
    std::ofstream f(tmp / "u.jsonl");
    f << R"({"text": "cafe\u0301 au lait"})"
      << "\n";  // the JSON escape of `decomposed`
    f << R"({"text": ")" << composed << "\"}\n";
  }
  // Not valid UTF-8, so it has no NFC: it is tokenized as it is (a .txt file: JSON refuses it).
  const std::string invalid = "bad utf-8 e\xcc\x81\xff kept as it is";
  std::ofstream(tmp / "v.txt") << invalid;
  auto tok = Tokenizer::LoadGpt2(std::string(KEEL_ASSET_DIR) + "/gpt2");
  ASSERT_NE(tok.Encode(decomposed), tok.Encode(composed));
  auto expect = [&](std::initializer_list<std::string> docs) {
    std::vector<int32_t> want;
    for (const std::string& d : docs) {
      auto ids = tok.Encode(d);
      want.insert(want.end(), ids.begin(), ids.end());
      want.push_back(50256);
    }
    return want;
  };
  PrepareOptions o = Options(tmp, "raw");
  o.inputs = {tmp / "u.jsonl", tmp / "v.txt"};
  o.val_fraction = 0;
  o.dedup = true;
  PrepareSummary raw = Prepare(o);
  EXPECT_EQ(raw.dropped_duplicate, 0u);
  EXPECT_EQ(ReadAll(tmp / "raw/train"), expect({decomposed, composed, invalid}));
  o.out = tmp / "nfc";
  o.nfc = true;
  PrepareSummary nfc = Prepare(o);
  EXPECT_EQ(nfc.dropped_duplicate, 1u);  // the two spellings are one text under NFC
  EXPECT_EQ(ReadAll(tmp / "nfc/train"), expect({composed, invalid}));
  EXPECT_TRUE(ReadDatasetMeta(tmp / "nfc/train").prepare->nfc);
}

TEST(Prepare, NfcDedupSeesTheSameTextInChunkedAndCompressedFiles) {
  TempDir tmp;
  // One text, long enough to be cut into pieces (and pre-passed), spelled with combining accents
  // in a .txt, a .txt.gz and a .txt.zst, and precomposed in a .jsonl.
  std::string decomposed, composed;
  for (int i = 0; i < 200; ++i) {
    decomposed += "Line " + std::to_string(i) + ": cafe\xcc\x81 and A\xcc\x8a.\n";
    composed += "Line " + std::to_string(i) + ": caf\xc3\xa9 and \xc3\x85.\n";
  }
  std::ofstream(tmp / "a.txt") << decomposed;
  std::ofstream(tmp / "b.txt.gz", std::ios::binary) << Gzip(decomposed);
  std::ofstream(tmp / "c.txt.zst", std::ios::binary) << Zstd(decomposed);
  std::ofstream(tmp / "d.jsonl") << nlohmann::json({{"text", composed}}).dump() << "\n";
  PrepareOptions o = Options(tmp, "out");
  o.inputs = {tmp / "a.txt", tmp / "b.txt.gz", tmp / "c.txt.zst", tmp / "d.jsonl"};
  o.val_fraction = 0;
  o.dedup = true;
  o.nfc = true;
  o.text_chunk_bytes = 100;
  PrepareSummary s = Prepare(o);
  EXPECT_EQ(s.documents_read, 4u);
  EXPECT_EQ(s.dropped_duplicate, 3u);
  auto want = Tokenizer::LoadGpt2(o.tokenizer_dir).Encode(composed);
  want.push_back(50256);
  EXPECT_EQ(ReadAll(tmp / "out/train"), want);
  o.nfc = false;  // without NFC the spellings differ: only the two other copies are duplicates
  o.out = tmp / "raw";
  EXPECT_EQ(Prepare(o).dropped_duplicate, 2u);
}

}  // namespace
}  // namespace keel::data

// Compressed inputs for `keel data prepare`: .gz and .zst files (alone, in folders, multi-member)
// give byte-identical datasets to their plain text; truncated or corrupt ones fail with one
// bad-input error naming the file, and leave no dataset. The command-line side (exit code 2, one
// line) is in bad_input_test.cc.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "data/compression.h"
#include "data/temp_dir.h"
#include "keel/core/error.h"
#include "keel/data/compressed_reader.h"
#include "keel/data/prepare.h"

namespace keel::data {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Spit(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

// The first `lines` documents of brown.jsonl: over 1 MiB, so decompression spans buffers.
std::string BrownHead(size_t lines) {
  std::ifstream in(std::string(KEEL_SHARED_DATA) + "/brown/brown.jsonl", std::ios::binary);
  std::string out, line;
  for (size_t i = 0; i < lines && std::getline(in, line); ++i) out += line + "\n";
  return out;
}

PrepareOptions Options(const std::vector<std::string>& inputs, const std::string& out) {
  PrepareOptions o;
  o.inputs = inputs;
  o.out = out;
  o.tokenizer_dir = std::string(KEEL_ASSET_DIR) + "/gpt2";
  o.progress = false;
  o.workers = 2;
  o.shard_tokens = 100000;
  o.val_fraction = 0.1;
  o.dedup = true;
  return o;
}

// Every file of a's train/ and val/ equals b's; returns how many were compared.
size_t ExpectSameDataset(const std::string& a, const std::string& b) {
  size_t compared = 0;
  for (const std::string split : {"train", "val"}) {
    for (const auto& e : fs::directory_iterator(a + "/" + split)) {
      const std::string name = e.path().filename().string();
      EXPECT_EQ(Slurp(e.path().string()), Slurp(b + "/" + split + "/" + name))
          << b << ": " << split << "/" << name;
      ++compared;
    }
  }
  return compared;
}

TEST(CompressedInput, GzAndZstJsonlMatchPlain) {
  TempDir tmp;
  const std::string text = BrownHead(150);
  ASSERT_GT(text.size(), size_t(1) << 20);
  Spit(tmp / "corpus.jsonl", text);
  Spit(tmp / "corpus.jsonl.gz", Gzip(text));
  Spit(tmp / "corpus.jsonl.zst", Zstd(text));
  // Two gzip members back to back, as `cat a.gz b.gz` makes: one stream of text.
  const size_t half = text.find('\n', text.size() / 2) + 1;
  Spit(tmp / "multi.jsonl.gz", Gzip(text.substr(0, half)) + Gzip(text.substr(half)));

  PrepareSummary plain = Prepare(Options({tmp / "corpus.jsonl"}, tmp / "plain"));
  EXPECT_EQ(plain.documents_read, 150u);
  for (const std::string name : {"corpus.jsonl.gz", "corpus.jsonl.zst", "multi.jsonl.gz"}) {
    PrepareSummary s = Prepare(Options({tmp / name}, tmp / ("out_" + name)));
    EXPECT_EQ(s.documents_read, plain.documents_read) << name;
    EXPECT_EQ(s.train_tokens, plain.train_tokens) << name;
    EXPECT_EQ(s.val_tokens, plain.val_tokens) << name;
    EXPECT_EQ(s.bytes_read, plain.bytes_read) << name;  // decompressed bytes
    EXPECT_GE(ExpectSameDataset(tmp / "plain", tmp / ("out_" + name)), 4u) << name;
  }
}

TEST(CompressedInput, FoldersMixPlainGzAndZstTextAndJsonl) {
  TempDir tmp;
  const std::string jsonl = BrownHead(40);
  std::string notes;
  for (int i = 0; i < 300; ++i) {
    notes += "Note " + std::to_string(i) + ": the quick brown fox, déjà vu.\nNext line\n";
  }
  const std::string small = "A small note.\n";
  Spit(tmp / "plain/a.jsonl", jsonl);
  Spit(tmp / "plain/b/notes.txt", notes);
  Spit(tmp / "plain/c.txt", small);
  Spit(tmp / "plain/skip.md", "not an input");
  Spit(tmp / "packed/a.jsonl.zst", Zstd(jsonl));
  Spit(tmp / "packed/b/notes.txt.gz", Gzip(notes));
  Spit(tmp / "packed/c.txt.zst", Zstd(small));
  Spit(tmp / "packed/skip.md.gz", Gzip("not an input"));

  for (uint64_t chunk : {uint64_t(1) << 20, uint64_t(512)}) {  // whole text, then chunked
    const std::string suffix = std::to_string(chunk);
    PrepareOptions p = Options({tmp / "plain"}, tmp / ("out_plain" + suffix));
    PrepareOptions c = Options({tmp / "packed"}, tmp / ("out_packed" + suffix));
    p.text_chunk_bytes = c.text_chunk_bytes = chunk;
    PrepareSummary sp = Prepare(p);
    PrepareSummary sc = Prepare(c);
    EXPECT_EQ(sp.files, 3u);
    EXPECT_EQ(sc.files, 3u);
    EXPECT_EQ(sc.documents_read, 42u);
    EXPECT_EQ(sc.train_tokens, sp.train_tokens);
    ExpectSameDataset(tmp / ("out_plain" + suffix), tmp / ("out_packed" + suffix));
  }
}

// Prepare fails with kBadInput, a message naming `path` and holding `what`, and no dataset.
void ExpectBadInput(const TempDir& tmp, const std::string& path, const std::string& what) {
  try {
    Prepare(Options({path}, tmp / "bad"));
    ADD_FAILURE() << "expected an error for " << path;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(tmp / "bad/train/meta.json"));
  EXPECT_FALSE(fs::exists(tmp / "bad/val/meta.json"));
}

TEST(CompressedInput, TruncatedGzIsABadInputNamingTheFile) {
  TempDir tmp;
  const std::string gz = Gzip(BrownHead(60));
  Spit(tmp / "cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  ExpectBadInput(tmp, tmp / "cut.jsonl.gz", "truncated gzip data: the file ends at byte");
  // Only the 8-byte trailer missing: the text is all there, the check is not.
  Spit(tmp / "tail.txt.gz", gz.substr(0, gz.size() - 8));
  ExpectBadInput(tmp, tmp / "tail.txt.gz", "truncated gzip");
  Spit(tmp / "empty.jsonl.gz", "");
  ExpectBadInput(tmp, tmp / "empty.jsonl.gz", "truncated gzip");
}

TEST(CompressedInput, CorruptZstIsABadInputNamingTheFile) {
  TempDir tmp;
  std::string zst = Zstd(BrownHead(60));
  std::string flipped = zst;
  flipped[flipped.size() / 2] ^= 0x5A;
  Spit(tmp / "flip.jsonl.zst", flipped);
  ExpectBadInput(tmp, tmp / "flip.jsonl.zst", "corrupt zstd data at compressed byte offset");
  std::string magic = zst;
  magic[0] = 'X';
  Spit(tmp / "magic.txt.zst", magic);
  ExpectBadInput(tmp, tmp / "magic.txt.zst", "corrupt zstd data at compressed byte offset 0");
  Spit(tmp / "cut.jsonl.zst", zst.substr(0, zst.size() - 3));
  ExpectBadInput(tmp, tmp / "cut.jsonl.zst", "truncated zstd data");
  std::string gz = Gzip("{\"text\": \"hello\"}\n");
  gz[12] ^= 0x7F;  // in the deflate data, after the 10-byte header
  Spit(tmp / "flip.jsonl.gz", gz);
  ExpectBadInput(tmp, tmp / "flip.jsonl.gz", "gzip data");
}

TEST(CompressedInput, ReaderStreamsLinesAcrossBuffers) {
  TempDir tmp;
  const std::string text = BrownHead(150) + "last line without newline";
  Spit(tmp / "t.txt.zst", Zstd(text));
  internal::CompressedReader r(tmp / "t.txt.zst");
  std::string all, line;
  size_t lines = 0;
  while (r.ReadLine(&line)) {
    all += line;
    ++lines;
  }
  EXPECT_EQ(all, text);
  EXPECT_EQ(lines, 151u);
  EXPECT_EQ(internal::InnerPath("x/notes.txt.gz"), "x/notes.txt");
  EXPECT_EQ(internal::InnerPath("corpus.jsonl.zst"), "corpus.jsonl");
  EXPECT_EQ(internal::InnerPath("corpus.jsonl"), "corpus.jsonl");
}

}  // namespace
}  // namespace keel::data

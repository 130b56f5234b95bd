// Every bad input of issue 3 in one place. Each case runs the `keel` verb that reads the input and
// expects exit code 2 and exactly one line, "keel: error: ...", naming the file and the line, key
// or offset, and no dataset left that looks complete. The finer wording is pinned beside the code
// that emits it: dataset_test.cc (each meta.json key, interrupted writes, ids in ShardWriter),
// compressed_input_test.cc (.gz/.zst offsets), prepare_test.cc (--on-error skip), data_cli_test.cc
// (a flipped byte: xxh3 mismatch), remote_cache_test.cc and remote_shards_test.cc (URLs: 404,
// corrupt shard on the server, dead server).
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "data/compression.h"
#include "data/run_keel.h"
#include "data/temp_dir.h"
#include "keel/core/error.h"
#include "keel/core/hex.h"
#include "keel/data/dataset.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/loader.h"
#include "keel/data/shard_writer.h"

namespace keel::data {
namespace {

namespace fs = std::filesystem;

// `keel ARGS` exits with 2 and prints one line holding every needle.
void ExpectOneLineError(const std::string& args, std::initializer_list<std::string> needles) {
  SCOPED_TRACE("keel " + args);
  const KeelResult r = Keel(args);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(r.output.starts_with("keel: error: ")) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  for (const std::string& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << r.output;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(fs::exists(KEEL_BINARY)) << "keel binary not built"; }

  std::string Prepare(const std::string& inputs, const std::string& flags = "") {
    return "data prepare " + inputs + " --out " + out_ + " --workers 2 " + flags;
  }
  void ExpectNoDataset() {
    EXPECT_FALSE(fs::exists(out_ + "/train/meta.json"));
    EXPECT_FALSE(fs::exists(out_ + "/val/meta.json"));
  }
  // A JSONL file of `good` documents with `bad` as line `at` (1-based; 0: none).
  std::string Jsonl(const std::string& name, int good, const std::string& bad = "", int at = 0) {
    std::string text;
    for (int line = 1, g = 0; g < good || line == at; ++line) {
      if (line == at) {
        text += bad + "\n";
      } else {
        text += R"({"text": "document )" + std::to_string(g++) + " with a few words\"}\n";
      }
    }
    Spit(tmp_ / name, text);
    return tmp_ / name;
  }
  // A good two-shard dataset in tmp_/ds with `id` as its 6th token; returns its folder.
  std::string Dataset(int vocab = 50257, int32_t id = 7) {
    ShardWriter w(ds_, {.vocab_size = vocab, .eos_id = vocab - 1, .shard_tokens = 40});
    for (int d = 0; d < 8; ++d) {
      std::vector<int32_t> doc(30, 100 + d);
      if (d == 0) doc[5] = id;
      doc.push_back(vocab - 1);
      w.AddDocument(doc);
    }
    EXPECT_GE(w.Finish().shards.size(), 2u);
    return ds_;
  }
  // Edits meta.json through `fn` on its JSON.
  template <typename Fn>
  void EditMeta(Fn fn) {
    nlohmann::json j = nlohmann::json::parse(Slurp(ds_ + "/meta.json"));
    fn(j);
    Spit(ds_ + "/meta.json", j.dump());
  }

  TempDir tmp_;
  std::string out_ = tmp_ / "out";
  std::string ds_ = tmp_ / "ds";
};

TEST_F(BadInput, MalformedJsonlLineNamesFileAndLine) {
  const std::string f = Jsonl("bad.jsonl", 50, R"({"text": "unterminated)", 30);
  ExpectOneLineError(Prepare(f), {f + ":30: ", "invalid JSON", "--on-error skip"});
  ExpectNoDataset();
}

TEST_F(BadInput, MissingFieldOrWrongTypeNamesFileAndLine) {
  std::string f = Jsonl("missing.jsonl", 5, R"({"body": "no text here"})", 2);
  ExpectOneLineError(Prepare(f), {f + ":2: ", "without \"text\""});
  f = Jsonl("number.jsonl", 5, R"({"text": 42})", 1);
  ExpectOneLineError(Prepare(f), {f + ":1: ", "\"text\" as a number"});
  f = Jsonl("array.jsonl", 5, R"(["text", "x"])", 6);
  ExpectOneLineError(Prepare(f), {f + ":6: ", "a JSON array"});
  ExpectNoDataset();
}

TEST_F(BadInput, BadFieldFlagNamesTheField) {
  const std::string f = Jsonl("good.jsonl", 5);
  ExpectOneLineError(Prepare(f, "--field body"), {f + ":1: ", "string field \"body\""});
  ExpectNoDataset();
}

TEST_F(BadInput, EmptyInputIsAnError) {
  fs::create_directories(tmp_ / "empty_dir");
  ExpectOneLineError(Prepare(tmp_ / "empty_dir"), {"no input files"});
  Spit(tmp_ / "empty.jsonl", "");
  ExpectOneLineError(Prepare(tmp_ / "empty.jsonl"), {tmp_ / "empty.jsonl", "no documents"});
  Spit(tmp_ / "blank.jsonl", "\n  \n\t\n");
  ExpectOneLineError(Prepare(tmp_ / "blank.jsonl"), {tmp_ / "blank.jsonl", "no documents"});
  // Text files alike: an empty or blank one is no document.
  Spit(tmp_ / "empty.txt", "");
  ExpectOneLineError(Prepare(tmp_ / "empty.txt"), {tmp_ / "empty.txt", "no documents"});
  Spit(tmp_ / "blank.txt", " \n\n");
  ExpectOneLineError(Prepare(tmp_ / "blank.txt"), {tmp_ / "blank.txt", "no documents"});
  Spit(tmp_ / "allbad.jsonl", "nope\n[1]\n");
  ExpectOneLineError(Prepare(tmp_ / "allbad.jsonl", "--on-error skip"),
                     {tmp_ / "allbad.jsonl", "no documents", "all 2 lines were bad"});
  ExpectNoDataset();
}

TEST_F(BadInput, MissingOrUnreadableInputNamesIt) {
  ExpectOneLineError(Prepare(tmp_ / "nope.jsonl"), {tmp_ / "nope.jsonl", "not found"});
  // Opens, then every read fails (EIO at address 0); unlike a chmod, this holds for root too.
  ExpectOneLineError(Prepare("/proc/self/mem"), {"/proc/self/mem", "cannot read"});
  if (::geteuid() != 0) {
    const std::string f = Jsonl("locked.jsonl", 3);
    fs::permissions(f, fs::perms::none);
    ExpectOneLineError(Prepare(f), {f, "cannot read"});
  }
  ExpectNoDataset();
}

TEST_F(BadInput, CorruptOrTruncatedCompressedInputNamesTheOffset) {
  const std::string text = Slurp(Jsonl("plain.jsonl", 400));
  std::string gz = Gzip(text);
  gz[gz.size() / 2] ^= 0x5A;
  Spit(tmp_ / "flip.jsonl.gz", gz);
  ExpectOneLineError(Prepare(tmp_ / "flip.jsonl.gz"), {tmp_ / "flip.jsonl.gz", "gzip data"});
  Spit(tmp_ / "cut.jsonl.gz", Gzip(text).substr(0, 200));
  ExpectOneLineError(Prepare(tmp_ / "cut.jsonl.gz"),
                     {tmp_ / "cut.jsonl.gz", "truncated gzip data: the file ends at byte 200"});
  std::string zst = Zstd(text);
  zst[0] = 'X';
  Spit(tmp_ / "magic.jsonl.zst", zst);
  ExpectOneLineError(Prepare(tmp_ / "magic.jsonl.zst"),
                     {tmp_ / "magic.jsonl.zst", "corrupt zstd data at compressed byte offset 0"});
  ExpectNoDataset();
}

TEST_F(BadInput, MetaJsonMissingNotJsonOrOfAnotherFormatOrVersion) {
  const std::string meta = Dataset() + "/meta.json";
  const std::string good = Slurp(meta);
  fs::remove(meta);
  ExpectOneLineError("data verify " + ds_, {meta, "missing"});
  ExpectOneLineError("data inspect " + ds_, {meta, "missing"});
  Spit(meta, "{\"format\": \"keel-tokens\",");
  ExpectOneLineError("data verify " + ds_, {meta, "expected JSON"});
  Spit(meta, good);
  EditMeta([](nlohmann::json& j) { j["format"] = "megatron"; });
  ExpectOneLineError("data verify " + ds_, {meta, "format: expected \"keel-tokens\""});
  Spit(meta, good);
  EditMeta([](nlohmann::json& j) { j["version"] = 2; });
  ExpectOneLineError("data verify " + ds_, {meta, "version: expected 1, got 2"});
  Spit(meta, good);
  EditMeta([](nlohmann::json& j) { j["shards"][1].erase("xxh3"); });
  ExpectOneLineError("data verify " + ds_, {meta, "shards[1].xxh3"});
}

TEST_F(BadInput, TruncatedShardNamesTheFileAndSizes) {
  const std::string bin = Dataset() + "/shard_00001.bin";
  const std::string bytes = Slurp(bin);
  Spit(bin, bytes.substr(0, bytes.size() - 3));
  ExpectOneLineError("data verify " + ds_,
                     {bin, "expected " + std::to_string(bytes.size()) + " bytes", "truncated"});
  ExpectOneLineError("data inspect " + ds_, {bin, "truncated"});
}

TEST_F(BadInput, InconsistentIndexNamesTheFileAndEntry) {
  const std::string idx = Dataset() + "/shard_00000.idx";
  const std::string good = Slurp(idx);
  // One offset short: the size does not match meta.json's document count.
  Spit(idx, good.substr(8));
  ExpectOneLineError("data verify " + ds_, {idx, "expected " + std::to_string(good.size())});
  // The right size and hash (meta.json updated), but entry 1 goes backwards.
  std::string bad = good;
  const uint64_t huge = 1000;
  std::memcpy(bad.data() + 8, &huge, 8);
  Spit(idx, bad);
  EditMeta([&](nlohmann::json& j) {
    j["shards"][0]["index_xxh3"] = HashHex(XXH3_64bits(bad.data(), bad.size()));
  });
  ExpectOneLineError("data verify " + ds_, {idx, "entry 1 is 1000", "non-decreasing"});
}

// meta.json's totals are required and must be the shards' sums.
TEST_F(BadInput, MetaJsonTotalsMustMatchTheShards) {
  Dataset();
  const std::string meta = ds_ + "/meta.json";
  const std::string good = Slurp(meta);
  EditMeta([](nlohmann::json& j) { j["documents"] = j["documents"].get<uint64_t>() + 1; });
  ExpectOneLineError("data verify " + ds_, {meta, "documents: expected the sum over shards"});
  Spit(meta, good);
  EditMeta([](nlohmann::json& j) { j.erase("tokens"); });
  ExpectOneLineError("data verify " + ds_, {meta, "tokens"});
  Spit(meta, good);
}

TEST_F(BadInput, TokenIdAtOrAboveVocabNamesTheOffset) {
  // Written for a vocabulary of 60000, then claimed to be GPT-2's: token 55555 does not fit.
  Dataset(60000, 55555);
  EditMeta([](nlohmann::json& j) {
    j["vocab_size"] = 50257;
    j["eos_id"] = 50256;
  });
  ExpectOneLineError("data verify " + ds_, {ds_ + "/shard_00000.bin", "token 55555 at offset 5",
                                            "(byte 10)", "expected an id < 50257"});
}

// A flat file's ids past the vocabulary are named, in the sample and as an error, not shown as
// <|endoftext|>.
TEST_F(BadInput, InspectNamesOutOfRangeIdsOfAFlatFile) {
  std::vector<uint16_t> ids = {464, 65535, 1110, 50257, 13};
  Spit(tmp_ / "bad.u16", std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 2));
  const KeelResult r = Keel("data inspect " + (tmp_ / "bad.u16"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("keel: error: " + (tmp_ / "bad.u16") +
                          ": token 65535 at offset 1 (byte 2): expected an id < 50257"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("<id 65535: out of range>"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("<id 50257: out of range>"), std::string::npos) << r.output;
}

TEST_F(BadInput, FlatFileWithAnOddByteCount) {
  Spit(tmp_ / "odd.u16", "abc");
  ExpectOneLineError("data verify " + (tmp_ / "odd.u16"), {tmp_ / "odd.u16", "even number"});
}

// Found when training starts, by the loader (`keel train` turns it into the same one line).
TEST_F(BadInput, DatasetShorterThanOneSampleNamesThePath) {
  {
    ShardWriter w(ds_, {});
    w.AddDocument(std::vector<int32_t>{1, 2, 3, 4, 50256});
    w.Finish();
  }
  TokenDataset ds = TokenDataset::Open(ds_);
  try {
    BatchLoader loader(ds, /*T=*/8, /*global_batch=*/1, /*rank=*/0, /*world=*/1, 1, true);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find(ds_ + ": 5 tokens is too few for one sample of seq_len "
                                               "+ 1 = 9"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace keel::data

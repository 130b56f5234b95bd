// Inputs found by the fuzz targets (fuzz/, docs/PERFORMANCE.md "Fuzzing") that once crashed or
// escaped as a non-keel exception; each must now be bad input with a one-line message.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "../bad_input.h"
#include "data/temp_dir.h"
#include "keel/data/dataset.h"
#include "keel/data/prepare.h"

namespace keel::data {
namespace {

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Meta(const std::string& tokens, const std::string& documents) {
  return R"({"format": "keel-tokens", "version": 1, "tokenizer": "gpt2", "vocab_size": 50257,
    "eos_id": 50256, "dtype": "uint16", "shards": [{"file": "shard_00000.bin",
    "index": "shard_00000.idx", "tokens": )" +
         tokens + R"(, "documents": )" + documents +
         R"(, "xxh3": "0000000000000000", "index_xxh3": "0000000000000000"}]})";
}

// 2^63 uint16 tokens "are" 0 bytes and (2^61 - 1 + 1) offsets "are" 0 bytes in 64-bit arithmetic:
// Open used to accept an empty shard with such counts, and `keel data inspect` then segfaulted.
TEST(FuzzRegression, CountsThatWrapTheFileSizeAreRefused) {
  TempDir dir;
  WriteFile(dir / "shard_00000.bin", "");
  WriteFile(dir / "meta.json", Meta("9223372036854775808", "1"));
  std::string idx(16, '\0');
  idx[15] = char(0x80);  // offsets 0 and 2^63
  WriteFile(dir / "shard_00000.idx", idx);
  std::string e = BadInputMessage([&] { TokenDataset::Open(dir.path()); });
  EXPECT_NE(e.find("shards[0].tokens: expected at most 2^60"), std::string::npos) << e;

  WriteFile(dir / "meta.json", Meta("0", "2305843009213693951"));
  WriteFile(dir / "shard_00000.idx", "");
  e = BadInputMessage([&] { TokenDataset::Open(dir.path()); });
  EXPECT_NE(e.find("shards[0].documents: expected at most 2^60"), std::string::npos) << e;
}

// A number no double holds is nlohmann's out_of_range, not a parse error: thrown on a worker
// thread, it ended `keel data prepare` with std::terminate, even under --on-error skip.
TEST(FuzzRegression, JsonlNumberOverflowIsABadLine) {
  TempDir dir;
  WriteFile(dir / "in.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\", \"x\": 1e999}\n");
  PrepareOptions o;
  o.inputs = {dir / "in.jsonl"};
  o.out = dir / "out";
  o.tokenizer_dir = std::string(KEEL_ASSET_DIR) + "/gpt2";
  o.val_fraction = 0;
  o.progress = false;
  const std::string e = BadInputMessage([&] { Prepare(o); });
  EXPECT_NE(e.find("in.jsonl:2: expected a JSON object"), std::string::npos) << e;
  EXPECT_NE(e.find("number overflow"), std::string::npos) << e;

  o.on_error = PrepareOnError::kSkip;
  const PrepareSummary s = Prepare(o);
  EXPECT_EQ(s.skipped_lines, 1u);
  EXPECT_EQ(s.train_documents, 1u);
}

}  // namespace
}  // namespace keel::data

// Fuzzes the input side of `keel data prepare` (data::Prepare): JSONL lines (JSON syntax, the
// "text" field, blank lines, CR/LF), plain text files cut into pieces, NFC, dedup and the length
// filter; then checks that what Prepare wrote passes VerifyDataset with the counts it reported.
//
// Input: one flags byte, then the file's bytes. Flags: 1 nfc, 2 dedup, 4 on_error skip, 8 a .txt
// file instead of .jsonl, 16 val_fraction 0.5, 32 text pieces of 16 bytes, 64 shards of 16
// tokens, 128 min_chars 3. The tokenizer is a 300-merge cut of GPT-2's (small_tokenizer.h):
// Prepare loads it per input, and the full one would cost most of the time.
#include <filesystem>

#include "fuzz_util.h"
#include "keel/data/dataset.h"
#include "keel/data/prepare.h"
#include "keel/data/verify.h"
#include "small_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static keel::fuzz::Scratch tok_dir("prepare_tokenizer");
  static const bool tok_ready = [] {
    keel::fuzz::WriteSmallGpt2(std::string(KEEL_SOURCE_DIR) + "/assets/gpt2", tok_dir.path(), 300);
    return true;
  }();
  (void)tok_ready;
  static keel::fuzz::Scratch dir("prepare");
  if (size == 0) return 0;
  dir.Clear();
  const uint8_t flags = data[0];
  keel::data::PrepareOptions o;
  o.inputs = {dir.Write(flags & 8 ? "in.txt" : "in.jsonl", keel::fuzz::Text(data + 1, size - 1))};
  o.out = dir.path() + "/out";
  o.tokenizer_dir = tok_dir.path();
  o.nfc = flags & 1;
  o.dedup = flags & 2;
  o.on_error = flags & 4 ? keel::data::PrepareOnError::kSkip : keel::data::PrepareOnError::kStop;
  o.val_fraction = flags & 16 ? 0.5 : 0;
  if (flags & 32) o.text_chunk_bytes = 16;
  if (flags & 64) o.shard_tokens = 16;
  o.min_chars = flags & 128 ? 3 : 0;
  o.workers = 1;
  o.progress = false;

  keel::fuzz::ExpectOnlyKeelErrors([&] {
    const keel::data::PrepareSummary sum = keel::data::Prepare(o);
    keel::fuzz::ExpectSuccess("verifying what Prepare wrote", [&] {
      for (const auto& [split, tokens, docs] :
           {std::tuple{"train", sum.train_tokens, sum.train_documents},
            {"val", sum.val_tokens, sum.val_documents}}) {
        const std::string path = o.out + "/" + split;
        if (!std::filesystem::exists(path + "/meta.json")) {
          keel::fuzz::Check(std::string(split) == "val" && tokens == 0,
                            std::string(split) + "/meta.json missing after a successful Prepare");
          continue;
        }
        const keel::data::VerifySummary v = keel::data::VerifyDataset(path);
        keel::fuzz::Check(v.tokens == tokens && v.documents == docs,
                          std::string(split) + ": written counts differ from the summary");
      }
    });
  });
  return 0;
}

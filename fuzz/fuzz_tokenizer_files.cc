// Fuzzes the GPT-2 tokenizer files (data::Tokenizer::LoadGpt2: encoder.json and vocab.bpe), then
// encodes a text with what was loaded: every id must be in the vocabulary and decode back to the
// text, whatever odd (but accepted) vocabulary the fuzzer made.
//
// Input: encoder.json, vocab.bpe, a text, and optionally a fourth part (any bytes) that turns
// allow_special on, separated by kSep (fuzz_util.h).
#include "fuzz_util.h"
#include "keel/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static keel::fuzz::Scratch dir("tokenizer_files");
  dir.Clear();
  std::vector<std::string> parts = keel::fuzz::SplitParts(data, size, 4);
  // A missing file is a case too: ReadWholeFile must say so.
  if (parts.size() > 0) dir.Write("encoder.json", parts[0]);
  if (parts.size() > 1) dir.Write("vocab.bpe", parts[1]);
  const std::string text = parts.size() > 2 ? parts[2] : "";
  const bool allow_special = parts.size() > 3;

  keel::fuzz::ExpectOnlyKeelErrors([&] {
    const auto tok = keel::data::Tokenizer::LoadGpt2(dir.path());
    keel::fuzz::ExpectSuccess("encoding with a loaded vocabulary", [&] {
      const std::vector<int32_t> ids = tok.Encode(text, allow_special);
      for (int32_t id : ids)
        keel::fuzz::Check(id >= 0 && id < tok.vocab_size(), "id out of the vocabulary");
      keel::fuzz::Check(tok.Decode(ids) == text, "Decode(Encode(text)) != text");
    });
  });
  return 0;
}

// Fuzzes GPT-2 encoding of arbitrary bytes with the real vocabulary (assets/gpt2): the text of
// every JSONL line and .txt file `keel data prepare` reads goes through it. Invalid UTF-8 must be
// encoded byte by byte, never an error; every text must decode back to itself.
//
// Input: the text. Encoded twice, without and with allow_special.
#include "fuzz_util.h"
#include "keel/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tok =
      keel::data::Tokenizer::LoadGpt2(std::string(KEEL_SOURCE_DIR) + "/assets/gpt2");
  const std::string text = keel::fuzz::Text(data, size);
  keel::fuzz::ExpectSuccess("encoding a text", [&] {
    for (bool allow_special : {false, true}) {
      const std::vector<int32_t> ids = tok.Encode(text, allow_special);
      for (int32_t id : ids)
        keel::fuzz::Check(id >= 0 && id < tok.vocab_size(), "id out of the vocabulary");
      keel::fuzz::Check(tok.Decode(ids) == text, "Decode(Encode(text)) != text");
    }
  });
  return 0;
}

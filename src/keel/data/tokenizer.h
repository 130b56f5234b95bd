// GPT-2 byte-level BPE, exact: the same ids as OpenAI's encoder and tiktoken's "gpt2".
//
//   auto tok = keel::data::Tokenizer::LoadGpt2("assets/gpt2");
//   std::vector<int32_t> ids = tok.Encode("Hello world");
//   std::string text = tok.Decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace keel::data {

class Tokenizer {
 public:
  // Reads encoder.json and vocab.bpe from `dir`. Throws keel::Error naming the file on bad input.
  static Tokenizer LoadGpt2(const std::string& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ordinary text: "<|endoftext|>" inside it is just text. With allow_special, that string maps to
  // eos_id(). Invalid UTF-8 is encoded byte by byte, never an error.
  std::vector<int32_t> Encode(std::string_view text, bool allow_special = false) const;
  // Appends to `out` (no allocation churn when called per document).
  void EncodeAppend(std::string_view text, std::vector<int32_t>* out,
                    bool allow_special = false) const;
  std::string Decode(const std::vector<int32_t>& ids) const;
  // The raw bytes of one token (may be part of a multi-byte character).
  std::string TokenBytes(int32_t id) const;

  int vocab_size() const;  // 50257
  int eos_id() const;      // 50256

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::data

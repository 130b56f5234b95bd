// Byte-level BPE, exact: the same ids as tiktoken for GPT-2 ("gpt2"), "cl100k_base",
// "o200k_base" and Llama 3's vocabulary, each with its own pre-token pattern and special tokens;
// also Hugging Face tokenizer.json files of byte-level BPE models.
//
//   auto tok = keel::data::Tokenizer::Load("cl100k", "assets");   // or "gpt2", "o200k", "llama3",
//                                                                  // or a tokenizer.json path
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
  // "gpt2", "cl100k", "o200k" or "llama3" (their files under `assets`: gpt2/ ships with keel,
  // tokenizers/*.tiktoken come from scripts/fetch_tokenizers.sh), or the path of a Hugging Face
  // tokenizer.json (or of a folder holding one). Throws keel::Error (bad input) naming the file.
  static Tokenizer Load(const std::string& spec, const std::string& assets);
  // Reads encoder.json and vocab.bpe from `dir`. Throws keel::Error naming the file on bad input.
  static Tokenizer LoadGpt2(const std::string& dir);
  // A tiktoken rank file ("BASE64 RANK" lines) with the pattern and special tokens of `encoding`:
  // "cl100k_base", "o200k_base" or "llama3".
  static Tokenizer LoadTiktoken(const std::string& path, const std::string& encoding);
  // A Hugging Face tokenizer.json of a byte-level BPE model (GPT-2's, Llama 3's and their like):
  // its vocabulary, merges, pre-token pattern and added tokens.
  static Tokenizer LoadHfJson(const std::string& path);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ordinary text: "<|endoftext|>" inside it is just text. With allow_special, each special token
  // of the vocabulary maps to its id. Invalid UTF-8 is encoded byte by byte, never an error.
  std::vector<int32_t> Encode(std::string_view text, bool allow_special = false) const;
  // Appends to `out` (no allocation churn when called per document).
  void EncodeAppend(std::string_view text, std::vector<int32_t>* out,
                    bool allow_special = false) const;
  std::string Decode(const std::vector<int32_t>& ids) const;
  // The raw bytes of one token (may be part of a multi-byte character).
  std::string TokenBytes(int32_t id) const;

  int vocab_size() const;  // one past the largest id: 50257 for GPT-2
  int eos_id() const;      // the token that ends a document: 50256 for GPT-2
  // "gpt2", "cl100k_base", "o200k_base", "llama3", or "hf:FILE" for a tokenizer.json.
  const std::string& name() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel::data

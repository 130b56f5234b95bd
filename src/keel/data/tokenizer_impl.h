// Internal to the tokenizer: the loaded vocabulary and compiled pre-token pattern shared by
// tokenizer.cc (encode/decode), tokenizer_load.cc (GPT-2's encoder.json and vocab.bpe) and
// tokenizer_formats.cc (tiktoken rank files, Hugging Face tokenizer.json).
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "keel/data/bytes_table.h"
#include "keel/data/tokenizer.h"

namespace keel::data {

// Everything the encoder needs. Tokenizer::Impl is private, so the free functions that do the work
// take this base instead.
struct BpeVocab {
  BpeVocab() = default;
  BpeVocab(const BpeVocab&) = delete;
  BpeVocab& operator=(const BpeVocab&) = delete;
  ~BpeVocab() {
    if (pattern) pcre2_code_free(pattern);
  }

  std::string_view Bytes(int32_t id) const {
    return std::string_view(token_arena)
        .substr(token_offset[size_t(id)], token_offset[size_t(id) + 1] - token_offset[size_t(id)]);
  }

  // Every token's bytes, back to back; token i is [token_offset[i], token_offset[i + 1]). Ids no
  // token has (cl100k's 100256) are empty and not in `present`.
  std::string token_arena;
  std::vector<uint32_t> token_offset;
  std::vector<bool> present;
  // Ordinary tokens only (not the special ones): bytes -> id.
  internal::BytesTable vocab{16};  // sized by the loader
  // (left id, right id) -> id of their concatenation, for every way of splitting every ordinary
  // token into two tokens. tiktoken ranks a pair by the id of the concatenated bytes; this table
  // answers that question without building the concatenation.
  internal::PairTable pairs;
  std::array<int32_t, 256> byte_token{};
  int32_t eos = 50256;
  std::string name = "gpt2";
  // Special tokens (text that allow_special turns into one id), longest first.
  std::vector<std::pair<std::string, int32_t>> specials;
  std::array<bool, 256> special_first{};  // bytes a special token starts with

  pcre2_code* pattern = nullptr;
  bool jit = false;
  // Distinguishes tokenizers in the thread-local word caches (addresses can be reused).
  uint64_t instance_id = 0;
};

struct Tokenizer::Impl : BpeVocab {};

// The pre-token patterns, as tiktoken writes them (its \s is Unicode White_Space).
extern const char* const kGpt2Pattern;
extern const char* const kCl100kPattern;  // also Llama 3's
extern const char* const kO200kPattern;

// Compiles a tiktoken-style pre-token pattern into vocab->pattern (JIT when available). Throws
// keel::Error (bad input) naming `where` if PCRE2 refuses it.
void CompilePretokenPattern(BpeVocab* vocab, const std::string& pattern, const std::string& where);

// Fills token_arena, token_offset, present, vocab and byte_token from `bytes` (id → bytes, ""
// for an id with no ordinary token) and the specials; `where` names the file in errors (every
// byte must have a token).
// A vocabulary's table has an entry per id up to the largest: ids far beyond the number of tokens
// would make it mostly holes (a rank near 2^30 in a file of 100 lines is 32 GB of them). Throws
// keel::Error (bad input) starting with `what` (the file and the id) when `top` exceeds twice
// the `entries` plus 1024.
void CheckVocabularyIds(size_t top, size_t entries, const std::string& what);

void SetTokens(BpeVocab* v, const std::vector<std::string>& bytes,
               std::vector<std::pair<std::string, int32_t>> specials, const std::string& where);
// tiktoken's merge rule: every split of every ordinary token into two tokens, so that any adjacent
// pair whose concatenation is a token can merge (at the rank of the concatenation's id).
void BuildPairsFromVocabulary(BpeVocab* v);
// GPT-2's bytes_to_unicode inverted (byte-level BPE files spell bytes as printable code points):
// code point → byte, -1 where unused.
std::array<int, 324> UnicodeToByte();
// One byte-level vocabulary string (UTF-8 of those code points) → raw bytes; false if it is not.
bool VocabStringToBytes(std::string_view s, const std::array<int, 324>& inv, std::string* out);
// A fresh instance id, so that thread-local word caches never mix two tokenizers.
uint64_t NextTokenizerInstance();

}  // namespace keel::data

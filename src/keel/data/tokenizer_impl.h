// Internal to the tokenizer: the loaded vocabulary and compiled pre-token pattern shared by
// tokenizer.cc (encode/decode) and tokenizer_load.cc (reading encoder.json and vocab.bpe).
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
struct Gpt2Vocab {
  Gpt2Vocab() = default;
  Gpt2Vocab(const Gpt2Vocab&) = delete;
  Gpt2Vocab& operator=(const Gpt2Vocab&) = delete;
  ~Gpt2Vocab() {
    if (pattern) pcre2_code_free(pattern);
  }

  std::string_view Bytes(int32_t id) const {
    return std::string_view(token_arena)
        .substr(token_offset[size_t(id)], token_offset[size_t(id) + 1] - token_offset[size_t(id)]);
  }

  // Every token's bytes, back to back; token i is [token_offset[i], token_offset[i + 1]).
  std::string token_arena;
  std::vector<uint32_t> token_offset;
  // Ordinary tokens only (not <|endoftext|>): bytes -> id.
  internal::BytesTable vocab{16};  // sized by LoadGpt2
  // (left id, right id) -> id of their concatenation, for every way of splitting every ordinary
  // token into two tokens. tiktoken ranks a pair by the id of the concatenated bytes; this table
  // answers that question without building the concatenation.
  internal::PairTable pairs;
  std::array<int32_t, 256> byte_token{};
  int32_t eos = 50256;

  pcre2_code* pattern = nullptr;
  bool jit = false;
  // Distinguishes tokenizers in the thread-local word caches (addresses can be reused).
  uint64_t instance_id = 0;
};

struct Tokenizer::Impl : Gpt2Vocab {};

// Compiles the GPT-2 pre-token pattern into vocab->pattern (JIT when available).
void CompilePretokenPattern(Gpt2Vocab* vocab);

}  // namespace keel::data

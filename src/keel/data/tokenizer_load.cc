// Loads the GPT-2 vocabulary (encoder.json, vocab.bpe) and compiles the pre-token pattern.
//
// GPT-2's files spell bytes as printable code points (OpenAI's bytes_to_unicode): byte b is
// itself when printable latin-1, else U+0100 + n. We undo that once at load so that everything
// after works on raw bytes, as tiktoken does.
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>

#include "keel/core/error.h"
#include "keel/data/file_util.h"
#include "keel/data/tokenizer_impl.h"

namespace keel::data {
namespace {

// code point -> byte, the inverse of GPT-2's bytes_to_unicode(); -1 where unused.
std::array<int, 324> UnicodeToByte() {
  std::array<int, 324> inv;
  inv.fill(-1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    inv[size_t(printable ? b : 256 + n++)] = b;
  }
  return inv;
}

// Decodes one GPT-2 vocabulary string (UTF-8 of the printable code points) into raw bytes.
bool VocabStringToBytes(std::string_view s, const std::array<int, 324>& inv, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size();) {
    auto c = uint8_t(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = (uint32_t(c & 0x1F) << 6) | (uint8_t(s[i + 1]) & 0x3F);
      i += 2;
    } else {
      return false;  // GPT-2 only uses code points below U+0144
    }
    if (cp >= inv.size() || inv[cp] < 0) return false;
    out->push_back(char(inv[cp]));
  }
  return true;
}

// Unicode White_Space, spelled out: PCRE2's \s under UCP also matches U+180E, which Unicode
// dropped from White_Space in 6.3 and which tiktoken (Rust regex) therefore treats as a symbol.
constexpr const char* kWhite =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

}  // namespace

void CompilePretokenPattern(Gpt2Vocab* impl) {
  // GPT-2's pattern: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  std::string w = kWhite;
  std::string pattern = "'(?:[sdmt]|ll|ve|re)| ?\\p{L}+| ?\\p{N}+| ?[^" + w + "\\p{L}\\p{N}]+|[" +
                        w + "]+(?![^" + w + "])|[" + w + "]+";
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // MATCH_INVALID_UTF: invalid UTF-8 never matches any item, so it is skipped by the search and
  // shows up as a gap between matches, which the encoder turns into byte-level tokens. Without
  // it PCRE2 would either reject the subject or (with NO_UTF_CHECK) have undefined behaviour.
  impl->pattern =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (!impl->pattern) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(err, msg.data(), msg.size());
    ThrowRuntime("tokenizer: cannot compile the pre-token pattern at offset " +
                 std::to_string(err_offset) + ": " + reinterpret_cast<const char*>(msg.data()));
  }
  // The JIT is 3-5x faster than the interpreter; fall back quietly where it is unavailable.
  impl->jit = pcre2_jit_compile(impl->pattern, PCRE2_JIT_COMPLETE) == 0;
}

Tokenizer Tokenizer::LoadGpt2(const std::string& dir) {
  static std::atomic<uint64_t> next_instance{1};
  auto impl = std::make_unique<Impl>();
  impl->instance_id = next_instance.fetch_add(1);
  const auto inv = UnicodeToByte();

  const std::string enc_path = dir + "/encoder.json";
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(ReadWholeFile(enc_path));
  } catch (const nlohmann::json::exception& e) {
    ThrowBadInput(enc_path + ": expected a JSON object of token -> id: " + e.what());
  }
  if (!enc.is_object() || enc.empty()) ThrowBadInput(enc_path + ": expected a JSON object");
  const size_t n = enc.size();
  std::vector<std::string> bytes(n);
  std::vector<bool> seen(n, false);
  std::string buf;
  for (const auto& [key, value] : enc.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= int64_t(n))
      ThrowBadInput(enc_path + ": token \"" + key + "\": expected an id in [0, " +
                    std::to_string(n) + ")");
    auto id = size_t(value.get<int64_t>());
    if (seen[id]) ThrowBadInput(enc_path + ": id " + std::to_string(id) + " appears twice");
    seen[id] = true;
    if (key == "<|endoftext|>") {
      impl->eos = int32_t(id);
      bytes[id] = key;
      continue;
    }
    if (!VocabStringToBytes(key, inv, &buf))
      ThrowBadInput(enc_path + ": token \"" + key + "\": not a GPT-2 byte-level string");
    bytes[id] = buf;
  }
  if (!enc.contains("<|endoftext|>")) ThrowBadInput(enc_path + ": expected a <|endoftext|> token");

  impl->token_offset.reserve(n + 1);
  impl->token_offset.push_back(0);
  for (const std::string& b : bytes) {
    impl->token_arena += b;
    impl->token_offset.push_back(uint32_t(impl->token_arena.size()));
  }
  impl->byte_token.fill(-1);
  // Sized for the vocabulary at hand (half full at most, as Insert keeps it): GPT-2's 50,257
  // entries get 2^17 slots, a small test vocabulary a table it can clear quickly.
  size_t slots = 16;
  while (slots < 2 * (n + 1)) slots *= 2;
  impl->vocab.Reset(slots);
  for (size_t id = 0; id < n; ++id) {
    if (int32_t(id) == impl->eos) continue;
    impl->vocab.Insert(bytes[id], internal::HashBytes(bytes[id]), id);
    if (bytes[id].size() == 1) impl->byte_token[uint8_t(bytes[id][0])] = int32_t(id);
  }
  for (int b = 0; b < 256; ++b) {
    if (impl->byte_token[size_t(b)] < 0)
      ThrowBadInput(enc_path + ": expected a token for every byte; byte " + std::to_string(b) +
                    " has none");
  }

  // Every split of every token into two tokens. Built from the vocabulary, not the merge list,
  // because tiktoken merges any adjacent pair whose concatenation is a token.
  std::vector<std::array<int32_t, 3>> triples;
  triples.reserve(n * 4);
  for (size_t id = 0; id < n; ++id) {
    if (int32_t(id) == impl->eos) continue;
    std::string_view s = bytes[id];
    for (size_t k = 1; k < s.size(); ++k) {
      const uint64_t* a = impl->vocab.Find(s.substr(0, k), internal::HashBytes(s.substr(0, k)));
      const uint64_t* b = impl->vocab.Find(s.substr(k), internal::HashBytes(s.substr(k)));
      if (a && b) triples.push_back({int32_t(*a), int32_t(*b), int32_t(id)});
    }
  }
  impl->pairs.Build(triples.size());
  for (const auto& t : triples) impl->pairs.Insert(t[0], t[1], t[2]);

  // vocab.bpe is redundant with encoder.json for encoding; check that they agree (merge i makes
  // token 256 + i), which catches a mismatched pair of files early.
  const std::string bpe_path = dir + "/vocab.bpe";
  const std::string merges = ReadWholeFile(bpe_path);
  size_t pos = 0, line_no = 0, merge_index = 0;
  std::string left, right;
  while (pos < merges.size()) {
    size_t end = merges.find('\n', pos);
    if (end == std::string::npos) end = merges.size();
    std::string_view line(merges.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.empty() || line.starts_with("#version")) continue;
    size_t space = line.find(' ');
    if (space == std::string_view::npos || !VocabStringToBytes(line.substr(0, space), inv, &left) ||
        !VocabStringToBytes(line.substr(space + 1), inv, &right)) {
      ThrowBadInput(bpe_path + ":" + std::to_string(line_no) + ": expected \"LEFT RIGHT\"");
    }
    left += right;
    const uint64_t* id = impl->vocab.Find(left, internal::HashBytes(left));
    if (!id || *id != 256 + merge_index) {
      ThrowBadInput(bpe_path + ":" + std::to_string(line_no) + ": merge " +
                    std::to_string(merge_index) + " does not match " + enc_path +
                    " (expected token " + std::to_string(256 + merge_index) + ")");
    }
    ++merge_index;
  }
  if (merge_index + 256 + 1 != n) {
    ThrowBadInput(bpe_path + ": expected " + std::to_string(n - 257) + " merges, found " +
                  std::to_string(merge_index));
  }

  CompilePretokenPattern(impl.get());
  return Tokenizer(std::move(impl));
}

}  // namespace keel::data

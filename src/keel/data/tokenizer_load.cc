// Loads the GPT-2 vocabulary (encoder.json, vocab.bpe) and compiles the pre-token pattern.
//
// GPT-2's files spell bytes as printable code points (OpenAI's bytes_to_unicode): byte b is
// itself when printable latin-1, else U+0100 + n. We undo that once at load so that everything
// after works on raw bytes, as tiktoken does.
#include <algorithm>
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/data/tokenizer_impl.h"

namespace keel::data {
namespace {

// Unicode White_Space, spelled out: PCRE2's \s under UCP also matches U+180E, which Unicode
// dropped from White_Space in 6.3 and which tiktoken (Rust regex) therefore treats as a symbol.
constexpr const char* kWhite =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// tiktoken's pattern with \s and \S replaced by kWhite (inside a character class, its contents).
std::string SpellOutWhitespace(const std::string& p, const std::string& where) {
  const std::string w = kWhite;
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[++i];
      if (d == 's') {
        out += in_class ? w : "[" + w + "]";
      } else if (d == 'S') {
        if (in_class)
          ThrowBadInput(where + ": pattern: \\S inside a character class is not supported");
        out += "[^" + w + "]";
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    if (!in_class && c == '[')
      in_class = true;
    else if (in_class && c == ']')
      in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

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

const char* const kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char* const kCl100kPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kO200kPattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
    "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

void CompilePretokenPattern(BpeVocab* impl, const std::string& tiktoken_pattern,
                            const std::string& where) {
  const std::string pattern = SpellOutWhitespace(tiktoken_pattern, where);
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
    ThrowBadInput(where + ": cannot compile the pre-token pattern at offset " +
                  std::to_string(err_offset) + ": " + reinterpret_cast<const char*>(msg.data()));
  }
  // The JIT is 3-5x faster than the interpreter; fall back quietly where it is unavailable.
  impl->jit = pcre2_jit_compile(impl->pattern, PCRE2_JIT_COMPLETE) == 0;
}

uint64_t NextTokenizerInstance() {
  static std::atomic<uint64_t> next_instance{1};
  return next_instance.fetch_add(1);
}

void CheckVocabularyIds(size_t top, size_t entries, const std::string& what) {
  if (top <= 2 * entries + 1024) return;
  ThrowBadInput(what + ": far beyond the " + std::to_string(entries) +
                " tokens the file has (expected ids below " + std::to_string(2 * entries + 1024) +
                "; a vocabulary's ids are dense)");
}

void SetTokens(BpeVocab* v, const std::vector<std::string>& bytes,
               std::vector<std::pair<std::string, int32_t>> specials, const std::string& where) {
  size_t n = bytes.size();
  for (const auto& [text, id] : specials) n = std::max(n, size_t(id) + 1);
  v->token_arena.clear();
  v->token_offset.assign(1, 0);
  v->present.assign(n, false);
  std::vector<std::string_view> text_of(n);
  for (const auto& [text, id] : specials) text_of[size_t(id)] = text;
  for (size_t id = 0; id < n; ++id) {
    const std::string_view b =
        id < bytes.size() && !bytes[id].empty() ? std::string_view(bytes[id]) : text_of[id];
    v->present[id] = !b.empty();
    v->token_arena += b;
    v->token_offset.push_back(uint32_t(v->token_arena.size()));
  }
  v->byte_token.fill(-1);
  // Sized for the vocabulary at hand (half full at most, as Insert keeps it): GPT-2's 50,257
  // entries get 2^17 slots, a small test vocabulary a table it can clear quickly.
  size_t slots = 16;
  while (slots < 2 * (bytes.size() + 1)) slots *= 2;
  v->vocab.Reset(slots);
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (bytes[id].empty()) continue;
    v->vocab.Insert(bytes[id], internal::HashBytes(bytes[id]), id);
    if (bytes[id].size() == 1) v->byte_token[uint8_t(bytes[id][0])] = int32_t(id);
  }
  for (int b = 0; b < 256; ++b)
    if (v->byte_token[size_t(b)] < 0)
      ThrowBadInput(where + ": expected a token for every byte; byte " + std::to_string(b) +
                    " has none");
  std::sort(specials.begin(), specials.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  v->special_first.fill(false);
  for (const auto& [text, id] : specials)
    if (!text.empty()) v->special_first[uint8_t(text[0])] = true;
  v->specials = std::move(specials);
}

void BuildPairsFromVocabulary(BpeVocab* v) {
  std::vector<std::array<int32_t, 3>> triples;
  const size_t n = v->present.size();
  triples.reserve(n * 4);
  std::unordered_set<int32_t> special_ids;
  for (const auto& [text, id] : v->specials) special_ids.insert(id);
  for (size_t id = 0; id < n; ++id) {
    if (!v->present[id] || special_ids.count(int32_t(id))) continue;
    const std::string_view s = v->Bytes(int32_t(id));
    for (size_t k = 1; k < s.size(); ++k) {
      const uint64_t* a = v->vocab.Find(s.substr(0, k), internal::HashBytes(s.substr(0, k)));
      const uint64_t* b = v->vocab.Find(s.substr(k), internal::HashBytes(s.substr(k)));
      if (a && b) triples.push_back({int32_t(*a), int32_t(*b), int32_t(id)});
    }
  }
  v->pairs.Build(triples.size());
  for (const auto& t : triples) v->pairs.Insert(t[0], t[1], t[2]);
}

Tokenizer Tokenizer::LoadGpt2(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->instance_id = NextTokenizerInstance();
  impl->name = "gpt2";
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

  std::vector<std::pair<std::string, int32_t>> specials = {{"<|endoftext|>", impl->eos}};
  bytes[size_t(impl->eos)].clear();
  SetTokens(impl.get(), bytes, specials, enc_path);
  // Every split of every token into two tokens. Built from the vocabulary, not the merge list,
  // because tiktoken merges any adjacent pair whose concatenation is a token.
  BuildPairsFromVocabulary(impl.get());

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

  CompilePretokenPattern(impl.get(), kGpt2Pattern, enc_path);
  return Tokenizer(std::move(impl));
}

}  // namespace keel::data

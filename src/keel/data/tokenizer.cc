// Byte-level BPE: pre-tokenization with PCRE2, then byte-pair merges per pre-token, with the same
// merge rule as tiktoken (merge the adjacent pair whose concatenation has the lowest id, leftmost
// first) so that ids match tiktoken's exactly.
//
// Speed comes from three things: a word whose bytes are a token is looked up directly; other
// words are cached per thread (natural text repeats words); and the merge loop works on small
// flat arrays with a pair table, never building byte strings.
#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <queue>

#include "keel/core/error.h"
#include "keel/data/tokenizer_impl.h"

namespace keel::data {
namespace {

// Pieces longer than this are merged with a heap instead of the O(n^2) scan (a 100 kB line of
// "aaaa..." must not take minutes), and are not cached (they are rare and would fill the cache).
constexpr size_t kSmallPiece = 128;
// Word cache bounds: cleared when exceeded, so memory stays bounded on endless corpora.
constexpr size_t kCacheMaxWords = size_t(1) << 20;
constexpr size_t kCacheMaxIds = size_t(1) << 23;

// Per-thread scratch and word cache. Encode is const and may run on many threads at once (the
// prepare workers share one Tokenizer); keeping mutable state per thread avoids locks.
struct ThreadState {
  ThreadState() : match(pcre2_match_data_create(1, nullptr)) {}
  ThreadState(const ThreadState&) = delete;
  ThreadState& operator=(const ThreadState&) = delete;
  ~ThreadState() { pcre2_match_data_free(match); }

  void Bind(uint64_t instance) {
    if (owner == instance) return;
    owner = instance;
    cache.Clear();
    cache_ids.clear();
  }

  uint64_t owner = 0;
  pcre2_match_data* match;
  internal::BytesTable cache{1 << 16};
  std::vector<int32_t> cache_ids;  // cache values are (offset << 32 | count) into this
  std::vector<int32_t> parts;
  std::vector<int32_t> ranks;
};

ThreadState& State() {
  thread_local ThreadState state;
  return state;
}

inline int32_t RankOf(int32_t merged) {
  return merged == internal::PairTable::kNone ? INT_MAX : merged;
}

// The O(n^2) merge of tiktoken on flat arrays: parts[i] are token ids, ranks[i] the id of
// parts[i] + parts[i + 1] (INT_MAX when that is no token). Fast for the short pieces of text.
void MergeSmall(const BpeVocab& t, std::string_view piece, ThreadState& ts,
                std::vector<int32_t>* out) {
  std::vector<int32_t>& parts = ts.parts;
  std::vector<int32_t>& ranks = ts.ranks;
  size_t n = piece.size();
  parts.resize(n);
  ranks.resize(n);
  for (size_t i = 0; i < n; ++i) parts[i] = t.byte_token[uint8_t(piece[i])];
  for (size_t i = 0; i + 1 < n; ++i) ranks[i] = RankOf(t.pairs.Find(parts[i], parts[i + 1]));
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == INT_MAX) break;
    parts[best] = ranks[best];
    std::memmove(&parts[best + 1], &parts[best + 2], (n - best - 2) * sizeof(int32_t));
    if (best + 2 < n) {
      std::memmove(&ranks[best + 1], &ranks[best + 2], (n - best - 3) * sizeof(int32_t));
    }
    --n;
    if (best > 0) ranks[best - 1] = RankOf(t.pairs.Find(parts[best - 1], parts[best]));
    if (best + 1 < n) ranks[best] = RankOf(t.pairs.Find(parts[best], parts[best + 1]));
  }
  out->insert(out->end(), parts.begin(), parts.begin() + ptrdiff_t(n));
}

// The same merge order with a min-heap of (rank, position) and a linked list of parts: O(n log n).
// Entries go stale when a neighbour merges; an entry is acted on only if the pair now at its
// position still concatenates to its rank, and then merging it is exactly tiktoken's next step
// (lowest rank, leftmost).
void MergeLarge(const BpeVocab& t, std::string_view piece, std::vector<int32_t>* out) {
  const size_t n = piece.size();
  std::vector<int32_t> tok(n);
  std::vector<size_t> next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    tok[i] = t.byte_token[uint8_t(piece[i])];
    next[i] = i + 1;
    prev[i] = i - 1;  // wraps for i = 0; never read there
  }
  using Entry = std::pair<int32_t, size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (size_t i = 0; i + 1 < n; ++i) {
    int32_t r = t.pairs.Find(tok[i], tok[i + 1]);
    if (r != internal::PairTable::kNone) heap.emplace(r, i);
  }
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    auto [rank, i] = heap.top();
    heap.pop();
    if (!alive[i] || next[i] >= n || t.pairs.Find(tok[i], tok[next[i]]) != rank) continue;
    size_t j = next[i];
    tok[i] = rank;
    alive[j] = false;
    next[i] = next[j];
    if (next[i] < n) prev[next[i]] = i;
    if (i > 0) {
      size_t p = prev[i];
      int32_t r = t.pairs.Find(tok[p], tok[i]);
      if (r != internal::PairTable::kNone) heap.emplace(r, p);
    }
    if (next[i] < n) {
      int32_t r = t.pairs.Find(tok[i], tok[next[i]]);
      if (r != internal::PairTable::kNone) heap.emplace(r, i);
    }
  }
  for (size_t i = 0; i < n; i = next[i]) out->push_back(tok[i]);
}

void EncodePiece(const BpeVocab& t, std::string_view piece, ThreadState& ts,
                 std::vector<int32_t>* out) {
  if (piece.size() == 1) {
    out->push_back(t.byte_token[uint8_t(piece[0])]);
    return;
  }
  if (piece.size() > kSmallPiece) {
    if (const uint64_t* id = t.vocab.Find(piece, internal::HashBytes(piece))) {
      out->push_back(int32_t(*id));
    } else {
      MergeLarge(t, piece, out);
    }
    return;
  }
  const uint64_t hash = internal::HashBytes(piece);
  // tiktoken returns a piece that is itself a token without merging; so must we (the merge
  // could in principle end elsewhere).
  if (const uint64_t* id = t.vocab.Find(piece, hash)) {
    out->push_back(int32_t(*id));
    return;
  }
  if (const uint64_t* v = ts.cache.Find(piece, hash)) {
    const int32_t* ids = ts.cache_ids.data() + (*v >> 32);
    out->insert(out->end(), ids, ids + (*v & 0xffffffffu));
    return;
  }
  const size_t before = out->size();
  MergeSmall(t, piece, ts, out);
  if (ts.cache.size() >= kCacheMaxWords || ts.cache_ids.size() >= kCacheMaxIds) {
    ts.cache.Clear();
    ts.cache_ids.clear();
  }
  const size_t count = out->size() - before;
  ts.cache.Insert(piece, hash, (uint64_t(ts.cache_ids.size()) << 32) | count);
  ts.cache_ids.insert(ts.cache_ids.end(), out->begin() + ptrdiff_t(before), out->end());
}

void EncodeOrdinary(const BpeVocab& t, std::string_view text, ThreadState& ts,
                    std::vector<int32_t>* out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ts.match);
  size_t pos = 0;
  while (pos < n) {
    int rc = t.jit ? pcre2_jit_match(t.pattern, subject, n, pos, 0, ts.match, nullptr)
                   : pcre2_match(t.pattern, subject, n, pos, 0, ts.match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      // Only invalid UTF-8 is left: the pattern matches every valid character.
      EncodePiece(t, text.substr(pos), ts, out);
      return;
    }
    if (rc < 0) {
      ThrowRuntime("tokenizer: pattern match failed at byte " + std::to_string(pos) +
                   " (PCRE2 error " + std::to_string(rc) + ")");
    }
    const size_t start = ov[0], end = ov[1];
    // A gap before the match is a run of invalid UTF-8; encode its bytes as one piece (the
    // merge only joins bytes into byte tokens, so decoding gives the bytes back).
    if (start > pos) EncodePiece(t, text.substr(pos, start - pos), ts, out);
    EncodePiece(t, text.substr(start, end - start), ts, out);
    pos = end > start ? end : start + 1;  // the pattern cannot match empty; never loop forever
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 4);
  EncodeAppend(text, &out, allow_special);
  return out;
}

void Tokenizer::EncodeAppend(std::string_view text, std::vector<int32_t>* out,
                             bool allow_special) const {
  ThreadState& ts = State();
  ts.Bind(impl_->instance_id);
  if (!allow_special) {
    EncodeOrdinary(*impl_, text, ts, out);
    return;
  }
  // Text between special tokens is encoded on its own, as tiktoken does: the regex never sees
  // across a special token. At each position the longest special token that starts there wins.
  // Specials are few and start with a handful of bytes ("<|..."): test them only there.
  const auto& specials = impl_->specials;  // longest first
  const auto& first = impl_->special_first;
  size_t pos = 0;
  for (size_t at = 0; at < text.size(); ++at) {
    if (!first[uint8_t(text[at])]) continue;
    for (const auto& [s, sid] : specials) {
      if (text.compare(at, s.size(), s) != 0) continue;
      EncodeOrdinary(*impl_, text.substr(pos, at - pos), ts, out);
      out->push_back(sid);
      pos = at + s.size();
      at = pos - 1;
      break;
    }
  }
  EncodeOrdinary(*impl_, text.substr(pos), ts, out);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !impl_->present[size_t(id)]) {
      ThrowBadInput("tokenizer: cannot decode id " + std::to_string(id) +
                    ": expected a token's id in [0, " + std::to_string(vocab_size()) + ")");
    }
    out += impl_->Bytes(id);
  }
  return out;
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->present[size_t(id)]) {
    ThrowBadInput("tokenizer: no token " + std::to_string(id) + ": expected an id in [0, " +
                  std::to_string(vocab_size()) + ")");
  }
  return std::string(impl_->Bytes(id));
}

int Tokenizer::vocab_size() const { return int(impl_->token_offset.size()) - 1; }
int Tokenizer::eos_id() const { return impl_->eos; }
const std::string& Tokenizer::name() const { return impl_->name; }

}  // namespace keel::data

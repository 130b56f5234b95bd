// InputReader: ordered, streaming access to prepare's input files; see prepare_input.h.
#include "keel/data/prepare_input.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "keel/core/error.h"
#include "keel/data/unicode_nfc.h"

namespace keel::data::internal {
namespace {

namespace fs = std::filesystem;

bool EndsWith(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool IsAsciiNonSpace(char c) {
  auto u = uint8_t(c);
  return u > 0x20 && u < 0x7F;
}

// A cut at p (text[0, p) then text[p, ...)) gives the same pre-tokens as no cut when text[p-1] is
// '\n' between two printable ASCII characters: in GPT-2's, cl100k's and o200k's patterns every
// alternative that can hold '\n' holds only whitespace or ends in line breaks, and none can start
// with one before a non-space, so no pre-token crosses the cut, and the "\s+(?!\S)" lookahead sees
// end of text instead of a non-space, which for a lone '\n' gives the same one-character pre-token.
size_t FindSafeCut(const std::string& s) {
  if (s.size() < 3) return 0;
  for (size_t p = s.size() - 1; p >= 2; --p) {
    if (s[p - 1] == '\n' && IsAsciiNonSpace(s[p - 2]) && IsAsciiNonSpace(s[p])) return p;
  }
  return 0;
}

}  // namespace

uint64_t CountCodePoints(const char* data, size_t n) {
  uint64_t count = 0;
  for (size_t i = 0; i < n; ++i) count += (uint8_t(data[i]) & 0xC0) != 0x80;
  return count;
}

InputReader::InputReader(const std::vector<std::string>& inputs, uint64_t text_chunk_bytes,
                         bool nfc)
    : chunk_bytes_(std::max<uint64_t>(text_chunk_bytes, 16)), nfc_(nfc) {
  for (const std::string& in : inputs) {
    std::error_code ec;
    fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) ThrowBadInput(in + ": not found: expected a file or folder of text");
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::end(it);
           it.increment(ec)) {
        const std::string p = it->path().string();
        const std::string inner = InnerPath(p);
        if (it->is_regular_file() && (EndsWith(inner, ".jsonl") || EndsWith(inner, ".txt"))) {
          found.push_back(p);
        }
      }
      if (ec) ThrowBadInput(in + ": cannot list: " + ec.message());
      std::sort(found.begin(), found.end());
      files_.insert(files_.end(), found.begin(), found.end());
    } else {
      files_.push_back(in);
    }
  }
  if (files_.empty()) {
    ThrowBadInput("no input files: expected .jsonl or .txt files (or .gz/.zst of them) or folders");
  }
}

InputReader::~InputReader() = default;

bool InputReader::OpenNextFile() {
  file_.reset();
  if (next_file_ >= files_.size()) return false;
  current_ = next_file_++;
  const std::string& path = files_[current_];
  file_ = std::make_unique<CompressedReader>(path);
  jsonl_ = EndsWith(InnerPath(path), ".jsonl");
  line_ = 0;
  pending_.clear();
  text_started_ = false;
  text_eof_ = false;
  chunked_ = false;
  if (!jsonl_) {
    // A compressed file's text size is known only after decompressing it, so it always gets the
    // pre-pass; the choice to chunk then depends on the text size alone, as for a plain file.
    const bool compressed = IsCompressedPath(path);
    std::error_code ec;
    uint64_t size = compressed ? 0 : fs::file_size(path, ec);
    chunked_ = !ec && size > chunk_bytes_;
    if (chunked_ || compressed) {
      // Pre-pass for the whole-document stats that filtering needs before the first piece.
      XXH3_state_t* st = XXH3_createState();
      XXH3_64bits_reset(st);
      std::string buf(1 << 20, '\0'), pending, normalized;
      text_chars_ = 0;
      uint64_t text_bytes = 0;
      auto add = [&](std::string_view piece) {
        if (nfc_ && NormalizeNfc(piece, &normalized)) piece = normalized;
        XXH3_64bits_update(st, piece.data(), piece.size());
        text_chars_ += CountCodePoints(piece.data(), piece.size());
      };
      try {
        for (size_t n; (n = file_->Read(buf.data(), buf.size())) > 0;) {
          text_bytes += n;
          if (!nfc_) {
            add({buf.data(), n});
            continue;
          }
          // NFC never joins across a cut just before an ASCII byte: ASCII is never the second
          // of a composition and never reorders. The rest waits for the next buffer.
          const size_t old = pending.size();
          pending.append(buf, 0, n);
          size_t cut = pending.size();
          while (cut > old && (uint8_t(pending[cut - 1]) & 0x80) != 0) --cut;
          if (cut > old && cut > 1) {
            add({pending.data(), cut - 1});
            pending.erase(0, cut - 1);
          }
        }
        add(pending);
      } catch (...) {
        XXH3_freeState(st);
        throw;
      }
      text_hash_ = XXH3_64bits_digest(st);
      XXH3_freeState(st);
      if (compressed) chunked_ = text_bytes > chunk_bytes_;
      file_ = std::make_unique<CompressedReader>(path);  // back to the start
    }
  }
  return true;
}

bool InputReader::Next(RawItem* item) {
  while (true) {
    if (!file_ && !OpenNextFile()) return false;
    if (jsonl_ ? NextJsonLine(item) : NextTextPiece(item)) {
      item->file = current_;
      return true;
    }
    file_.reset();
  }
}

bool InputReader::NextJsonLine(RawItem* item) {
  while (true) {
    if (!file_->ReadLine(&line_buf_)) return false;
    ++line_;
    bytes_read_ += line_buf_.size();
    size_t len = line_buf_.size();
    while (len > 0 && (line_buf_[len - 1] == '\n' || line_buf_[len - 1] == '\r')) --len;
    bool blank = std::all_of(line_buf_.begin(), line_buf_.begin() + len,
                             [](char c) { return c == ' ' || c == '\t'; });
    if (blank) continue;
    *item = RawItem{};
    item->kind = RawItem::Kind::kJsonLine;
    item->bytes.assign(line_buf_, 0, len);
    item->line = line_;
    return true;
  }
}

bool InputReader::NextTextPiece(RawItem* item) {
  *item = RawItem{};
  item->kind = RawItem::Kind::kText;
  if (!chunked_) {
    if (text_started_) return false;
    text_started_ = true;
    std::string all;
    std::string buf(1 << 20, '\0');
    for (size_t n; (n = file_->Read(buf.data(), buf.size())) > 0;) all.append(buf, 0, n);
    bytes_read_ += all.size();
    item->bytes = std::move(all);
    return true;
  }
  if (text_started_ && text_eof_ && pending_.empty()) return false;
  // Fill to the chunk size, then cut at the last safe line break; if there is none, read more.
  size_t cut = 0;
  while (true) {
    size_t want = pending_.size() + chunk_bytes_;
    while (!text_eof_ && pending_.size() < want) {
      size_t old = pending_.size();
      pending_.resize(want);
      size_t n = file_->Read(pending_.data() + old, want - old);
      pending_.resize(old + n);
      bytes_read_ += n;
      if (n == 0) text_eof_ = true;
    }
    if (text_eof_) break;
    cut = FindSafeCut(pending_);
    if (cut > 0) break;
  }
  item->first = !text_started_;
  if (item->first) {
    item->has_stats = true;
    item->hash = text_hash_;
    item->chars = text_chars_;
  }
  text_started_ = true;
  if (cut == 0) {
    item->bytes = std::move(pending_);
    pending_.clear();
    item->last = true;
  } else {
    item->bytes = pending_.substr(0, cut);
    pending_.erase(0, cut);
    item->last = false;
  }
  return true;
}

}  // namespace keel::data::internal

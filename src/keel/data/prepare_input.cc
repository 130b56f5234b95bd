// InputReader: ordered, streaming access to prepare's input files; see prepare_input.h.
#include "keel/data/prepare_input.h"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "keel/core/error.h"

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
// '\n' between two printable ASCII characters: every pattern alternative that can hold '\n' holds
// only whitespace, so no pre-token crosses the cut, and the "\s+(?!\S)" lookahead sees end of text
// instead of a non-space, which for a lone '\n' gives the same one-character pre-token.
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

InputReader::InputReader(const std::vector<std::string>& inputs, uint64_t text_chunk_bytes)
    : chunk_bytes_(std::max<uint64_t>(text_chunk_bytes, 16)) {
  for (const std::string& in : inputs) {
    std::error_code ec;
    fs::file_status st = fs::status(in, ec);
    if (ec || !fs::exists(st)) ThrowBadInput(in + ": not found: expected a file or folder of text");
    if (fs::is_directory(st)) {
      std::vector<std::string> found;
      for (auto it = fs::recursive_directory_iterator(in, ec); !ec && it != fs::end(it);
           it.increment(ec)) {
        const std::string p = it->path().string();
        if (it->is_regular_file() && (EndsWith(p, ".jsonl") || EndsWith(p, ".txt"))) {
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
  if (files_.empty()) ThrowBadInput("no input files: expected .jsonl or .txt files or folders");
}

InputReader::~InputReader() {
  if (file_) std::fclose(file_);
  std::free(line_buf_);
}

bool InputReader::OpenNextFile() {
  if (file_) {
    std::fclose(file_);
    file_ = nullptr;
  }
  if (next_file_ >= files_.size()) return false;
  current_ = next_file_++;
  const std::string& path = files_[current_];
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) ThrowBadInput(path + ": cannot read: " + std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  jsonl_ = EndsWith(path, ".jsonl");
  line_ = 0;
  pending_.clear();
  text_started_ = false;
  text_eof_ = false;
  chunked_ = false;
  if (!jsonl_) {
    std::error_code ec;
    uint64_t size = fs::file_size(path, ec);
    chunked_ = !ec && size > chunk_bytes_;
    if (chunked_) {
      // Pre-pass for the whole-document stats that filtering needs before the first piece.
      XXH3_state_t* st = XXH3_createState();
      XXH3_64bits_reset(st);
      std::string buf(1 << 20, '\0');
      text_chars_ = 0;
      for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), file_)) > 0;) {
        XXH3_64bits_update(st, buf.data(), n);
        text_chars_ += CountCodePoints(buf.data(), n);
      }
      text_hash_ = XXH3_64bits_digest(st);
      XXH3_freeState(st);
      if (std::ferror(file_)) ThrowBadInput(path + ": read error");
      std::rewind(file_);
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
    std::fclose(file_);
    file_ = nullptr;
  }
}

bool InputReader::NextJsonLine(RawItem* item) {
  while (true) {
    ssize_t n = ::getline(&line_buf_, &line_cap_, file_);
    if (n < 0) {
      if (std::ferror(file_)) ThrowBadInput(files_[current_] + ": read error");
      return false;
    }
    ++line_;
    bytes_read_ += uint64_t(n);
    size_t len = size_t(n);
    while (len > 0 && (line_buf_[len - 1] == '\n' || line_buf_[len - 1] == '\r')) --len;
    bool blank =
        std::all_of(line_buf_, line_buf_ + len, [](char c) { return c == ' ' || c == '\t'; });
    if (blank) continue;
    *item = RawItem{};
    item->kind = RawItem::Kind::kJsonLine;
    item->bytes.assign(line_buf_, len);
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
    for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), file_)) > 0;) all.append(buf, 0, n);
    if (std::ferror(file_)) ThrowBadInput(files_[current_] + ": read error");
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
      size_t n = std::fread(pending_.data() + old, 1, want - old, file_);
      pending_.resize(old + n);
      bytes_read_ += n;
      if (n == 0) {
        if (std::ferror(file_)) ThrowBadInput(files_[current_] + ": read error");
        text_eof_ = true;
      }
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

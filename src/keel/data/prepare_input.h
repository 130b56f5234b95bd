// Internal to `keel data prepare`: walks the inputs (files, folders) in a fixed order and yields
// raw work items, one JSONL line or one piece of a text file at a time, so memory stays bounded
// by the item size whatever the corpus size. Parsing and tokenizing happen on worker threads.
// Inputs may be gzip (.gz) or zstd (.zst) compressed; they are decompressed as a stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "keel/data/compressed_reader.h"

namespace keel::data::internal {

struct RawItem {
  enum class Kind { kJsonLine, kText };
  Kind kind = Kind::kText;
  std::string bytes;
  size_t file = 0;    // index into InputReader::files()
  uint64_t line = 0;  // 1-based, for JSONL error messages
  // A text document larger than the chunk size comes in several pieces; only the first starts a
  // document and only the last ends it. The first carries the whole document's XXH3 and code
  // point count, from a pre-pass over the file (has_stats); other items get them from workers.
  bool first = true;
  bool last = true;
  bool has_stats = false;
  uint64_t hash = 0;
  uint64_t chars = 0;
};

// Number of UTF-8 code points (bytes that are not continuation bytes).
uint64_t CountCodePoints(const char* data, size_t n);

class InputReader {
 public:
  // Expands folders (recursively: *.jsonl and *.txt, each also as .gz or .zst, sorted) and checks
  // that every input exists. A file's extension without .gz/.zst decides JSONL vs text.
  // With `nfc`, the whole-document stats of a pre-passed text file are of its NFC form, as the
  // workers compute them for other documents. Throws keel::Error (bad input) for a missing input
  // or when no files are found.
  InputReader(const std::vector<std::string>& inputs, uint64_t text_chunk_bytes, bool nfc = false);
  InputReader(const InputReader&) = delete;
  InputReader& operator=(const InputReader&) = delete;
  ~InputReader();

  // The next item in input order; false when all files are done.
  bool Next(RawItem* item);

  const std::vector<std::string>& files() const { return files_; }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  bool OpenNextFile();
  bool NextJsonLine(RawItem* item);
  bool NextTextPiece(RawItem* item);

  std::vector<std::string> files_;
  uint64_t chunk_bytes_;
  bool nfc_;
  size_t next_file_ = 0;
  size_t current_ = 0;
  std::unique_ptr<CompressedReader> file_;
  bool jsonl_ = false;
  uint64_t line_ = 0;
  std::string line_buf_;
  // Text file state: whole-file stats, the pending bytes not yet handed out, and whether the
  // first piece has been handed out.
  bool chunked_ = false;
  bool text_started_ = false;
  bool text_eof_ = false;
  uint64_t text_hash_ = 0, text_chars_ = 0;
  std::string pending_;
  uint64_t bytes_read_ = 0;  // decompressed bytes
};

}  // namespace keel::data::internal

// Internal to `keel data prepare`: CompressedReader streams the bytes of one input file, plain,
// gzip (.gz) or zstd (.zst), decompressing a buffer at a time so that memory stays bounded
// whatever the file size. Corrupt or truncated compressed data throws keel::Error (bad input)
// naming the file and the compressed byte offset.
#pragma once

#include <zlib.h>
#include <zstd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace keel::data::internal {

// True for a path ending in ".gz" or ".zst".
bool IsCompressedPath(const std::string& path);
// The path without a ".gz" or ".zst" suffix: its inner extension decides JSONL vs text.
std::string InnerPath(const std::string& path);

class CompressedReader {
 public:
  // Opens the file; the codec comes from the suffix (.gz, .zst, else plain).
  // Throws keel::Error (bad input) when the file cannot be opened.
  explicit CompressedReader(const std::string& path);
  CompressedReader(const CompressedReader&) = delete;
  CompressedReader& operator=(const CompressedReader&) = delete;
  ~CompressedReader();

  // Up to n decompressed bytes into dst; 0 only at the clean end of the file.
  size_t Read(char* dst, size_t n);
  // The next line, '\n' included when present, replacing *line; false at the end of the file.
  bool ReadLine(std::string* line);

  const std::string& path() const { return path_; }

 private:
  enum class Codec { kPlain, kGzip, kZstd };

  size_t ReadRaw(char* dst, size_t n);  // unbuffered decompressed bytes
  size_t ReadGzip(char* dst, size_t n);
  size_t ReadZstd(char* dst, size_t n);
  void Refill();  // reads compressed bytes into in_ once in_ is used up
  [[noreturn]] void Corrupt(const std::string& codec, const std::string& why) const;
  [[noreturn]] void Truncated(const std::string& codec) const;

  std::string path_;
  Codec codec_ = Codec::kPlain;
  std::FILE* file_ = nullptr;
  // Compressed input: in_[in_pos_, in_len_) is not yet consumed; consumed_ counts the bytes of
  // the file consumed so far (the offset that errors report).
  std::vector<char> in_;
  size_t in_pos_ = 0, in_len_ = 0;
  uint64_t consumed_ = 0;
  bool eof_ = false;
  z_stream z_{};
  bool z_init_ = false;
  bool z_member_ended_ = false;
  ZSTD_DCtx* zstd_ = nullptr;
  bool zstd_frame_done_ = false;
  // Decompressed bytes for ReadLine: out_[out_pos_, out_len_) not yet handed out.
  std::vector<char> out_;
  size_t out_pos_ = 0, out_len_ = 0;
};

}  // namespace keel::data::internal

// CompressedReader: streaming reads of plain, gzip and zstd input files; see compressed_reader.h.
#include "keel/data/compressed_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "keel/core/error.h"

namespace keel::data::internal {
namespace {

constexpr size_t kBufferBytes = 1 << 20;

bool EndsWith(const std::string& s, const char* suffix) {
  size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

bool IsCompressedPath(const std::string& path) {
  return EndsWith(path, ".gz") || EndsWith(path, ".zst");
}

std::string InnerPath(const std::string& path) {
  if (EndsWith(path, ".gz")) return path.substr(0, path.size() - 3);
  if (EndsWith(path, ".zst")) return path.substr(0, path.size() - 4);
  return path;
}

CompressedReader::CompressedReader(const std::string& path) : path_(path) {
  if (EndsWith(path, ".gz")) {
    codec_ = Codec::kGzip;
  } else if (EndsWith(path, ".zst")) {
    codec_ = Codec::kZstd;
  }
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) ThrowBadInput(path + ": cannot read: " + std::strerror(errno));
  if (codec_ == Codec::kPlain) {
    std::setvbuf(file_, nullptr, _IOFBF, kBufferBytes);
  } else {
    in_.resize(kBufferBytes);
  }
  if (codec_ == Codec::kGzip) {
    // 15 + 32: the largest window, and a gzip or zlib header detected automatically.
    if (inflateInit2(&z_, 15 + 32) != Z_OK) ThrowRuntime(path + ": cannot start zlib");
    z_init_ = true;
  } else if (codec_ == Codec::kZstd) {
    zstd_ = ZSTD_createDCtx();
    if (!zstd_) ThrowRuntime(path + ": cannot start zstd");
  }
}

CompressedReader::~CompressedReader() {
  if (z_init_) inflateEnd(&z_);
  if (zstd_) ZSTD_freeDCtx(zstd_);
  if (file_) std::fclose(file_);
}

void CompressedReader::Corrupt(const std::string& codec, const std::string& why) const {
  ThrowBadInput(path_ + ": corrupt " + codec + " data at compressed byte offset " +
                std::to_string(consumed_) + ": " + why);
}

void CompressedReader::Truncated(const std::string& codec) const {
  ThrowBadInput(path_ + ": truncated " + codec + " data: the file ends at byte " +
                std::to_string(consumed_) + ", expected more compressed data");
}

void CompressedReader::Refill() {
  if (in_pos_ < in_len_ || eof_) return;
  in_pos_ = 0;
  errno = 0;
  in_len_ = std::fread(in_.data(), 1, in_.size(), file_);
  if (in_len_ == 0) {
    if (std::ferror(file_)) ThrowBadInput(path_ + ": cannot read: " + std::strerror(errno));
    eof_ = true;
  }
}

size_t CompressedReader::ReadGzip(char* dst, size_t n) {
  while (true) {
    Refill();
    if (z_member_ended_) {
      if (in_pos_ == in_len_) return 0;  // Refill found the end of the file
      // Another gzip member follows (as `cat a.gz b.gz` makes).
      inflateReset(&z_);
      z_member_ended_ = false;
    }
    const size_t avail = in_len_ - in_pos_;
    z_.next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
    z_.avail_in = uInt(avail);
    z_.next_out = reinterpret_cast<Bytef*>(dst);
    z_.avail_out = uInt(n);
    int ret = inflate(&z_, Z_NO_FLUSH);
    const size_t used = avail - z_.avail_in;
    in_pos_ += used;
    consumed_ += used;
    const size_t got = n - z_.avail_out;
    if (ret == Z_STREAM_END) {
      z_member_ended_ = true;
    } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
      Corrupt("gzip", z_.msg ? z_.msg : "inflate error " + std::to_string(ret));
    }
    if (got > 0) return got;
    if (!z_member_ended_ && in_pos_ == in_len_ && eof_) Truncated("gzip");
  }
}

size_t CompressedReader::ReadZstd(char* dst, size_t n) {
  while (true) {
    Refill();
    // With no input left, a call after a finished frame would only ask for the next one.
    if (in_pos_ == in_len_ && eof_ && zstd_frame_done_) return 0;
    ZSTD_inBuffer in{in_.data() + in_pos_, in_len_ - in_pos_, 0};
    ZSTD_outBuffer out{dst, n, 0};
    const size_t ret = ZSTD_decompressStream(zstd_, &out, &in);
    in_pos_ += in.pos;
    consumed_ += in.pos;
    if (ZSTD_isError(ret)) Corrupt("zstd", ZSTD_getErrorName(ret));
    // 0: a frame is completely decoded and flushed; otherwise more input or output is due.
    zstd_frame_done_ = ret == 0;
    if (out.pos > 0) return out.pos;
    if (in_pos_ == in_len_ && eof_) {
      if (zstd_frame_done_) return 0;
      Truncated("zstd");
    }
  }
}

size_t CompressedReader::ReadRaw(char* dst, size_t n) {
  if (n == 0) return 0;
  switch (codec_) {
    case Codec::kGzip:
      return ReadGzip(dst, n);
    case Codec::kZstd:
      return ReadZstd(dst, n);
    case Codec::kPlain:
      break;
  }
  errno = 0;
  size_t got = std::fread(dst, 1, n, file_);
  if (got == 0 && std::ferror(file_))
    ThrowBadInput(path_ + ": cannot read: " + std::strerror(errno));
  return got;
}

size_t CompressedReader::Read(char* dst, size_t n) {
  if (out_pos_ < out_len_) {
    size_t take = std::min(n, out_len_ - out_pos_);
    std::memcpy(dst, out_.data() + out_pos_, take);
    out_pos_ += take;
    return take;
  }
  return ReadRaw(dst, n);
}

bool CompressedReader::ReadLine(std::string* line) {
  line->clear();
  if (out_.empty()) out_.resize(kBufferBytes);
  while (true) {
    if (out_pos_ == out_len_) {
      out_pos_ = 0;
      out_len_ = ReadRaw(out_.data(), out_.size());
      if (out_len_ == 0) return !line->empty();
    }
    const char* begin = out_.data() + out_pos_;
    const size_t avail = out_len_ - out_pos_;
    const void* nl = std::memchr(begin, '\n', avail);
    const size_t take = nl ? size_t(static_cast<const char*>(nl) - begin) + 1 : avail;
    line->append(begin, take);
    out_pos_ += take;
    if (nl) return true;
  }
}

}  // namespace keel::data::internal

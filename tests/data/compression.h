// Compresses test inputs in memory the way the gzip and zstd command-line tools do, for tests of
// `keel data prepare` on .gz and .zst files.
//
//   Spit(tmp / "a.jsonl.gz", Gzip(text));
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <string>

namespace keel::data {

inline std::string Gzip(const std::string& text) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, uLong(text.size())) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = uInt(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = uInt(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

inline std::string Zstd(const std::string& text) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);  // as the zstd command line does
  std::string out(ZSTD_compressBound(text.size()), '\0');
  size_t n = ZSTD_compress2(c, out.data(), out.size(), text.data(), text.size());
  EXPECT_FALSE(ZSTD_isError(n)) << ZSTD_getErrorName(n);
  ZSTD_freeCCtx(c);
  out.resize(n);
  return out;
}

}  // namespace keel::data

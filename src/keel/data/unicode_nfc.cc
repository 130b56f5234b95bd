// NormalizeNfc; see unicode_nfc.h.
#include "keel/data/unicode_nfc.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace keel::data {

bool NormalizeNfc(std::string_view in, std::string* out) {
  // Most corpora are mostly ASCII, which NFC leaves unchanged; skip the library call for it.
  if (std::all_of(in.begin(), in.end(), [](char c) { return (uint8_t(c) & 0x80) == 0; })) {
    out->assign(in);
    return true;
  }
  utf8proc_uint8_t* dst = nullptr;
  // An explicit length (no UTF8PROC_NULLTERM), so a NUL inside the text is just a code point.
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(in.data()),
                                          utf8proc_ssize_t(in.size()), &dst,
                                          utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(dst, &std::free);
  if (n < 0) return false;
  out->assign(reinterpret_cast<const char*>(dst), size_t(n));
  return true;
}

}  // namespace keel::data

// Unicode Normalization Form C for `keel data prepare --nfc`, through utf8proc (Debian's
// libutf8proc): canonically equivalent texts ("e\u0301" and "\u00e9") become the same bytes, so
// they get the same tokens and the same dedup hash.
//
//   std::string out;
//   if (keel::data::NormalizeNfc(text, &out)) text = out;
#pragma once

#include <string>
#include <string_view>

namespace keel::data {

// Writes the NFC form of `in` to *out and returns true; returns false (and leaves *out alone) when
// `in` is not valid UTF-8, for which NFC is not defined. ASCII text is returned as it is.
bool NormalizeNfc(std::string_view in, std::string* out);

}  // namespace keel::data

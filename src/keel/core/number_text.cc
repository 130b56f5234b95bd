#include "keel/core/number_text.h"

#include <charconv>
#include <cmath>

namespace keel {
namespace {

template <typename T>
std::string ShortestText(T v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

}  // namespace

std::string ShortestDecimal(float v) {
  // The shortest text for the float is read back as a double and then rounded to float; in the
  // rare case that double rounding lands elsewhere, the exact double text is used instead.
  std::string s = ShortestText(v);
  double back = 0;
  std::from_chars(s.data(), s.data() + s.size(), back);
  if (std::isfinite(v) && static_cast<float>(back) != v) s = ShortestText(static_cast<double>(v));
  return s;
}

std::string ShortestDecimal(double v) { return ShortestText(v); }

}  // namespace keel

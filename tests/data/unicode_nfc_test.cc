// NormalizeNfc: composes what NFC composes, keeps ASCII and NUL, refuses invalid UTF-8.
#include "keel/data/unicode_nfc.h"

#include <gtest/gtest.h>

namespace keel::data {
namespace {

TEST(NormalizeNfc, ComposesDecomposedText) {
  std::string out;
  ASSERT_TRUE(NormalizeNfc("cafe\xcc\x81", &out));  // e + U+0301 COMBINING ACUTE ACCENT
  EXPECT_EQ(out, "caf\xc3\xa9");                    // U+00E9
  ASSERT_TRUE(NormalizeNfc("A\xcc\x8a", &out));     // A + ring above
  EXPECT_EQ(out, "\xc3\x85");                       // U+00C5
  // Hangul jamo compose into one syllable.
  ASSERT_TRUE(NormalizeNfc("\xe1\x84\x80\xe1\x85\xa1", &out));
  EXPECT_EQ(out, "\xea\xb0\x80");  // U+AC00
}

TEST(NormalizeNfc, LeavesNormalTextAndNulAlone) {
  std::string out;
  ASSERT_TRUE(NormalizeNfc(std::string_view("a\0b", 3), &out));
  EXPECT_EQ(out, std::string("a\0b", 3));
  ASSERT_TRUE(NormalizeNfc("d\xc3\xa9j\xc3\xa0 \xe2\x80\x94 \xf0\x9f\x98\x80", &out));
  EXPECT_EQ(out, "d\xc3\xa9j\xc3\xa0 \xe2\x80\x94 \xf0\x9f\x98\x80");
  ASSERT_TRUE(NormalizeNfc("", &out));
  EXPECT_EQ(out, "");
}

TEST(NormalizeNfc, RefusesInvalidUtf8) {
  std::string out = "untouched";
  EXPECT_FALSE(NormalizeNfc("e\xcc\x81 \xff", &out));
  EXPECT_EQ(out, "untouched");
}

}  // namespace
}  // namespace keel::data

// For tests of bad input: runs `fn`, expects a bad-input keel::Error of one line, and returns its
// message (empty, with a failure recorded, if none was thrown).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "keel/core/error.h"

namespace keel {

template <typename Fn>
std::string BadInputMessage(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a keel::Error";
  return "";
}

}  // namespace keel

// Shared by the libFuzzer targets in this folder: one input split into several files, a scratch
// folder in /dev/shm, and the rule that decides what is a finding.
//
// keel's parsers promise keel::Error (bad input) for any bytes they cannot accept; that is the
// expected outcome and the target returns. Anything else — a sanitizer report, a crash, a hang,
// another exception escaping keel, or a broken round trip — aborts, so libFuzzer saves the input.
//
//   extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
//     static keel::fuzz::Scratch dir("manifest");
//     keel::fuzz::ExpectOnlyKeelErrors([&] { Parse(dir.Write("m.json", Text(data, size))); });
//     return 0;
//   }
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "keel/core/error.h"

namespace keel::fuzz {

// Separates the files packed into one input. Long and unlike any real content, so that a seed
// made of real files splits where it was joined, and readable in a seed file.
inline constexpr std::string_view kSep = "\n--keel-fuzz-part--\n";

inline std::string Text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// The parts of `data` between separators, at most `max_parts` (the last keeps any further
// separators as content).
inline std::vector<std::string> SplitParts(const uint8_t* data, size_t size, size_t max_parts) {
  std::string_view s(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  while (parts.size() + 1 < max_parts) {
    size_t at = s.find(kSep);
    if (at == std::string_view::npos) break;
    parts.emplace_back(s.substr(0, at));
    s.remove_prefix(at + kSep.size());
  }
  parts.emplace_back(s);
  return parts;
}

// A folder in /dev/shm (memory, so that thousands of writes per second cost nothing), one per
// process and target, removed at exit.
class Scratch {
 public:
  explicit Scratch(const std::string& name)
      : path_("/dev/shm/keel-fuzz-" + name + "-" + std::to_string(::getpid())) {
    Clear();
  }
  ~Scratch() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  const std::string& path() const { return path_; }

  // Empties the folder: nothing of the previous input may leak into this one.
  void Clear() const {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    std::filesystem::create_directories(path_);
  }

  // Writes `bytes` to FOLDER/name (replacing it) and returns the path.
  std::string Write(const std::string& name, std::string_view bytes) const {
    const std::string p = path_ + "/" + name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) Fail("cannot write the scratch file " + p);
    return p;
  }

  [[noreturn]] static void Fail(const std::string& what) {
    std::fprintf(stderr, "keel-fuzz: %s\n", what.c_str());
    std::abort();
  }

 private:
  std::string path_;
};

// A property of a successful parse that must hold (a round trip, a bound).
inline void Check(bool ok, const std::string& what) {
  if (!ok) Scratch::Fail("property violated: " + what);
}

// Runs fn; keel::Error is the expected answer to bad input. Any other exception is a finding:
// the parsers' headers promise keel::Error naming the file, and `keel` would report anything else
// as an internal error (exit 1) with a message that does not name the input.
template <typename Fn>
void ExpectOnlyKeelErrors(Fn&& fn) {
  try {
    fn();
  } catch (const keel::Error&) {
    return;
  } catch (const std::exception& e) {
    Scratch::Fail(std::string("a non-keel exception escaped: ") + e.what());
  }
}

// For a step that must succeed (reading back what keel itself wrote): any exception is a finding.
template <typename Fn>
void ExpectSuccess(const std::string& what, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    Scratch::Fail(what + " failed: " + e.what());
  }
}

}  // namespace keel::fuzz

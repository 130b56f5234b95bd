// `keel data` end to end through the real executable: exit codes and the one-line errors.
// Skipped when the keel binary has not been built (data_test does not depend on it).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "data/temp_dir.h"

namespace keel::data {
namespace {

struct Result {
  int code;
  std::string output;
};

Result Keel(const std::string& args) {
  std::string cmd = std::string(KEEL_BINARY) + " " + args + " 2>&1";
  Result r{-1, ""};
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(DataCli, PrepareInspectVerify) {
  ASSERT_TRUE(std::filesystem::exists(KEEL_BINARY)) << "keel binary not built";
  TempDir tmp;
  const std::string brown = std::string(KEEL_SHARED_DATA) + "/brown/brown.jsonl";
  Result r = Keel("data prepare " + brown + " --out " + (tmp / "b") + " --workers 2 --dedup");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("500 documents"), std::string::npos) << r.output;

  r = Keel("data inspect " + (tmp / "b/train"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("The Fulton County Grand Jury"), std::string::npos) << r.output;

  r = Keel("data verify " + (tmp / "b/train"));
  ASSERT_EQ(r.code, 0) << r.output;

  {
    std::fstream f(tmp / "b/train/shard_00000.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put('\x55');
  }
  r = Keel("data verify " + (tmp / "b/train"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("shard_00000.bin: xxh3"), std::string::npos) << r.output;

  r = Keel("data inspect " + (tmp / "nothing"));
  EXPECT_EQ(r.code, 2) << r.output;
}

TEST(DataCli, HelpHasExamples) {
  ASSERT_TRUE(std::filesystem::exists(KEEL_BINARY)) << "keel binary not built";
  Result r = Keel("help data");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("keel data prepare"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::data

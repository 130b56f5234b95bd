// `keel data` end to end through the real executable: exit codes and the one-line errors.
// Skipped when the keel binary has not been built (data_test does not depend on it).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "data/run_keel.h"
#include "data/temp_dir.h"

namespace keel::data {
namespace {

TEST(DataCli, PrepareInspectVerify) {
  ASSERT_TRUE(std::filesystem::exists(KEEL_BINARY)) << "keel binary not built";
  TempDir tmp;
  const std::string brown = std::string(KEEL_SHARED_DATA) + "/brown/brown.jsonl";
  KeelResult r = Keel("data prepare " + brown + " --out " + (tmp / "b") + " --workers 2 --dedup");
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
  KeelResult r = Keel("help data");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("keel data prepare"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace keel::data

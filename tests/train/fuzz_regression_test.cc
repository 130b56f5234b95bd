// Inputs found by the fuzz targets (fuzz/, docs/PERFORMANCE.md "Fuzzing"): a run config that
// LoadConfig accepted but whose resolved config.toml (ToToml) it could not read back.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "../bad_input.h"
#include "keel/train/config.h"
#include "train/run_util.h"

namespace keel::train {
namespace {

// A bare --set string was taken byte for byte; ToToml then wrote bytes that are not UTF-8, and
// the run's config.toml failed to parse on resume.
TEST(FuzzRegression, SetValueThatIsNotUtf8IsBadInput) {
  const std::string e = BadInputMessage([] { LoadConfig("", {"train.name=run\xad"}); });
  EXPECT_NE(e.find("--set train.name"), std::string::npos) << e;
  EXPECT_NE(e.find("expected UTF-8 text"), std::string::npos) << e;
  // Valid UTF-8 is still taken as it is.
  EXPECT_EQ(LoadConfig("", {"train.name=r\xc3\xa9sum\xc3\xa9"}).train.name, "r\xc3\xa9sum\xc3\xa9");
}

// ToToml's "# Read from PATH" comment: a path that is not UTF-8 or holds a control character
// would make the comment, and so the whole file, unreadable; it is left out instead.
TEST(FuzzRegression, ConfigPathThatIsNotTomlTextIsNotWrittenAsAComment) {
  test::TempDir dir;
  for (const std::string name : {"a\xff.toml", "a\x01.toml"}) {
    const std::string path = dir / name;
    std::ofstream(path) << "[train]\nsteps = 7\n";
    RunConfig cfg = LoadConfig(path, {});
    const std::string written = ToToml(cfg);
    EXPECT_EQ(written.find("# Read from"), std::string::npos) << written;
    std::ofstream(dir / "resolved.toml") << written;
    RunConfig again = LoadConfig(dir / "resolved.toml", {});
    again.source = cfg.source;
    EXPECT_EQ(again, cfg);
  }
}

}  // namespace
}  // namespace keel::train

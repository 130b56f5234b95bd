// `keel preflight` end to end: every row is printed, the JSON carries a verdict per row, a
// dataset is measured against what the step consumes, and a no-go exits non-zero.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "train/run_util.h"

namespace {

// `keel ARGS` with stderr folded into stdout, as a user sees it.
using Result = keel::test::RunResult;

Result Keel(const std::string& args) {
  const std::string cmd = std::string(KEEL_BINARY) + " " + args;
  return keel::test::RunCommand("{ { " + cmd + "; } 2>&1; }");
}

const char* kRows[] = {"software", "matmul bf16", "matmul fp32", "step",    "memory bandwidth",
                       "memory",   "checkpoint",  "data",        "offload", "all-reduce"};

TEST(PreflightCli, QuickPrintsEveryRow) {
  Result r = Keel("preflight --quick --model gpt2-tiny --set data.seq_len=64");
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out;
  for (const char* row : kRows) {
    // Each row starts a line with its name, then its verdict.
    const std::string line_start = std::string("\n") + row + " ";
    EXPECT_NE(r.out.find(line_start), std::string::npos) << row << "\n" << r.out;
  }
  EXPECT_NE(r.out.find("verdict: "), std::string::npos) << r.out;
  // The exit code follows the verdict.
  EXPECT_EQ(r.code == 0, r.out.find("verdict: GO") != std::string::npos) << r.out;
}

TEST(PreflightCli, JsonHasAVerdictAndNumbersPerRow) {
  Result r = Keel("preflight --quick --model gpt2-tiny --set data.seq_len=64 --json");
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(0, r.out.rfind('}') + 1));
  ASSERT_EQ(j["rows"].size(), std::size(kRows));
  const std::set<std::string> verdicts = {"go", "warn", "no-go", "skip"};
  for (size_t i = 0; i < std::size(kRows); ++i) {
    const auto& row = j["rows"][i];
    EXPECT_EQ(row["check"], kRows[i]);
    EXPECT_TRUE(verdicts.count(row["verdict"].get<std::string>())) << row.dump();
  }
  // Measured, not copied from a table: positive rates on this machine.
  EXPECT_GT(j["rows"][1]["data"]["gflops_per_rank"][0].get<double>(), 0);
  EXPECT_GT(j["rows"][3]["data"]["step_s_per_rank"][0].get<double>(), 0);
  EXPECT_GT(j["rows"][3]["data"]["predicted_s"].get<double>(), 0);
  EXPECT_GT(j["rows"][4]["data"]["copy_bytes_per_s_per_rank"][0].get<double>(), 0);
  EXPECT_GT(j["rows"][6]["data"]["write_bytes_per_s_per_rank"][0].get<double>(), 0);
  EXPECT_EQ(j["rows"][8]["verdict"], "skip");  // no [offload] dir
  EXPECT_EQ(j["rows"][9]["verdict"], "skip");  // one rank: no all-reduce
}

TEST(PreflightCli, MeasuresADatasetAgainstTheStep) {
  // A flat file of little-endian uint16 tokens, one of the formats keel reads.
  const auto path = std::filesystem::temp_directory_path() / "keel_preflight_tokens.bin";
  {
    std::vector<uint16_t> tokens(1 << 20);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t(i * 7919 % 50000);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  }
  Result r = Keel("preflight --quick --model gpt2-tiny --set data.seq_len=64 --json --data " +
                  path.string());
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(0, r.out.rfind('}') + 1));
  const auto& data = j["rows"][7];
  EXPECT_NE(data["verdict"], "skip") << data.dump();
  EXPECT_GT(data["data"]["tokens_per_s_per_rank"][0].get<double>(), 0) << data.dump();
  EXPECT_GT(data["data"]["consumed_tokens_per_s"].get<double>(), 0) << data.dump();
  std::filesystem::remove(path);
}

TEST(PreflightCli, WritesTheTableAsJsonIntoTheRunDirectory) {
  const auto dir = std::filesystem::temp_directory_path() / "keel_preflight_run";
  std::filesystem::remove_all(dir);
  const auto cfg = std::filesystem::temp_directory_path() / "keel_preflight_run.toml";
  std::ofstream(cfg) << "[model]\nname = \"gpt2-tiny\"\n[data]\nseq_len = 64\n[train]\nname = "
                        "\"pf\"\nout_dir = \""
                     << dir.string() << "\"\n";
  Result r = Keel("preflight --quick --config " + cfg.string());
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out;
  std::ifstream in(dir / "pf" / "preflight.json");
  ASSERT_TRUE(in.good()) << "no " << (dir / "pf" / "preflight.json") << "\n" << r.out;
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["rows"].size(), std::size(kRows));
  EXPECT_EQ(j["verdict"] == "go", r.code == 0);
  // The round trip ran in the run's checkpoint folder and left nothing behind.
  EXPECT_NE(j["rows"][6]["measured"].get<std::string>().find("pf/checkpoints"), std::string::npos)
      << j["rows"][6].dump();
  EXPECT_FALSE(std::filesystem::exists(dir / "pf" / "checkpoints"));
  std::filesystem::remove_all(dir);
  std::filesystem::remove(cfg);
}

TEST(PreflightCli, AnUnwritableCheckpointDirIsANoGo) {
  Result r = Keel(
      "preflight --quick --model gpt2-tiny --set data.seq_len=64 --dir /proc/keel-preflight-nope");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("verdict: NO-GO"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no-go: checkpoint"), std::string::npos) << r.out;
}

// With [offload] dir the offload row streams through a real tier there and prices the state's
// traffic; an offload folder it cannot use is a no-go naming it.
TEST(PreflightCli, MeasuresTheOffloadTier) {
  const auto dir = std::filesystem::temp_directory_path() / "keel_preflight_tier";
  Result r = Keel(
      "preflight --quick --model gpt2-tiny --set data.seq_len=64 --json --set "
      "offload.dir=" +
      dir.string());
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(0, r.out.rfind('}') + 1));
  const auto& row = j["rows"][8];
  EXPECT_EQ(row["check"], "offload");
  EXPECT_NE(row["verdict"], "skip") << row.dump();
  EXPECT_GT(row["data"]["bytes_per_s_per_rank"][0].get<double>(), 0) << row.dump();
  EXPECT_GT(row["data"]["io_s"].get<double>(), 0) << row.dump();
  std::filesystem::remove_all(dir);
  r = Keel(
      "preflight --quick --model gpt2-tiny --set data.seq_len=64 --set "
      "offload.dir=/proc/keel-no-tier");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("no-go: offload"), std::string::npos) << r.out;
}

TEST(PreflightCli, BadInputIsOneLine) {
  Result r = Keel("preflight --efficiency 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--efficiency 2: expected in (0, 1]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
}

}  // namespace

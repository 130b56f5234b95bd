// Issue 32, for `keel launch` and `keel health`: counts and sizes are checked (one line, exit 2),
// and every refusal comes before the supervisor writes the run folder: bad data, a metrics port in
// use, and a run folder that another job holds (the second launch, or a keel train beside it,
// names the holder).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "train/run_util.h"

namespace keel::test {
namespace {

const std::string kKeel = KEEL_BINARY;
const std::string kTiny = std::string(KEEL_SOURCE_DIR) + "/configs/test-tiny.toml";

void ExpectOneLine(const RunResult& r, const std::string& want) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << "want " << want << ": " << r.err;
}

TEST(LaunchCli, CountsAndSizesAreChecked) {
  ExpectOneLine(RunCommand(kKeel + " launch " + kTiny + " --np 0"),
                "keel launch --np: expected a number in [1, 4096], got 0");
  ExpectOneLine(RunCommand(kKeel + " launch " + kTiny + " --np -1"), "got -1");
  ExpectOneLine(RunCommand(kKeel + " health --min-free-gb -1"),
                "keel health --min-free-gb: expected a number in [0, 1000000000], got -1");
  ExpectOneLine(RunCommand(kKeel + " health --min-free-gb nan"), "got nan");
  ExpectOneLine(RunCommand(kKeel + " health --min-gflops -5"), "keel health --min-gflops");
}

TEST(LaunchCli, RefusalsComeBeforeTheRunFolderIsWritten) {
  TempDir dir;
  const std::string all = ReadFile(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.u16");
  ASSERT_GT(all.size(), 200000u) << "missing ../shared/data/brown/brown.gpt2.u16";
  const std::string data = dir / "brown.u16";
  std::ofstream(data, std::ios::binary).write(all.data(), 200000);
  const std::string launch = "OMP_NUM_THREADS=1 " + kKeel + " launch " + kTiny +
                             " --set train.out_dir=" + dir.path() + " --set launch.backoff_s=0.2";
  ExpectOneLine(RunCommand(launch + " --set data.train=" + (dir / "missing.u16")), "missing.u16");
  EXPECT_FALSE(std::filesystem::exists(dir / "test-tiny"));
  ExpectOneLine(RunCommand("KEEL_FAULT='kill@3:7' " + launch + " --set data.train=" + data),
                "rank 7: the job has 1 rank(s)");
  EXPECT_FALSE(std::filesystem::exists(dir / "test-tiny"));

  TakenPort taken;
  const std::string port = taken.port();
  ASSERT_FALSE(port.empty());
  ExpectOneLine(
      RunCommand(launch + " --set data.train=" + data + " --set monitor.metrics_port=" + port),
      "metrics_port " + port + ": cannot listen");
  taken.Free();
  EXPECT_FALSE(std::filesystem::exists(dir / "test-tiny"));

  // One launch trains; a second launch, and a keel train, on its folder are refused naming it.
  const std::string run = dir / "test-tiny";
  ASSERT_EQ(RunCommand("(" + launch + " --set data.train=" + data + " --set train.steps=100000 >" +
                       (dir / "first.log") + " 2>&1 & echo $! >" + (dir / "first.pid") + ")")
                .code,
            0);
  const std::string pid =
      ReadFile(dir / "first.pid").substr(0, ReadFile(dir / "first.pid").find('\n'));
  RunCommand("for i in $(seq 600); do [ -s " + run + "/metrics.jsonl ] && break; sleep 0.1; done");
  ASSERT_TRUE(std::filesystem::exists(run + "/metrics.jsonl")) << ReadFile(dir / "first.log");
  const size_t events = ReadFile(run + "/events.jsonl").size();
  ExpectOneLine(RunCommand(launch + " --set data.train=" + data),
                "keel launch: " + run + " is in use by another keel job (host ");
  const RunResult train =
      RunCommand("OMP_NUM_THREADS=1 " + kKeel + " train " + kTiny +
                 " --set train.out_dir=" + dir.path() + " --set data.train=" + data);
  ExpectOneLine(train, "pid " + pid + ")");
  EXPECT_EQ(ReadFile(run + "/events.jsonl").find("\"launch_start\"", events), std::string::npos)
      << "the second launch wrote the first's events";
  RunCommand("kill -TERM " + pid + "; while kill -0 " + pid + " 2>/dev/null; do sleep 0.2; done");
  EXPECT_NE(ReadFile(dir / "first.log").find("keel launch:"), std::string::npos);
}

}  // namespace
}  // namespace keel::test

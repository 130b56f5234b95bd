// Issue 32, for `keel report` and `keel dashboard`: the report never overwrites what it reads or a
// file that is not a report; sizes and addresses are checked; a FIFO as a run file is refused, not
// read forever; lines over 1 MiB are skipped and counted, and the lines after them still come.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "train/run_util.h"

namespace keel::test {
namespace {

const std::string kKeel = KEEL_BINARY;

void ExpectOneLine(const RunResult& r, const std::string& want) {
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << "want " << want << ": " << r.err;
}

// A run folder with metrics lines 1..5, line 2 of 9 MiB and line 4 of 2 MiB.
std::string RunWithLongLines(const TempDir& dir) {
  const std::string run = dir / "run";
  std::filesystem::create_directories(run);
  std::ofstream m(run + "/metrics.jsonl");
  for (int step = 1; step <= 5; ++step) {
    nlohmann::json j = {{"step", step}, {"loss", 4.0 - 0.1 * step}, {"ms", 10.0}};
    if (step == 2) j["pad"] = std::string(9 << 20, 'x');
    if (step == 4) j["pad"] = std::string(2 << 20, 'y');
    m << j.dump() << "\n";
  }
  // A line a crash cut short, with a resumed run's first line appended to it: not JSON.
  std::ofstream(run + "/events.jsonl") << "{\"event\":\"checkpo{\"event\":\"start\"}\n";
  return run;
}

TEST(ReportCli, NeverOverwritesWhatItReadsOrAFileThatIsNotAReport) {
  TempDir dir;
  const std::string run = RunWithLongLines(dir);
  const std::string metrics = ReadFile(run + "/metrics.jsonl");
  ExpectOneLine(RunCommand(kKeel + " report " + run + " --out " + run + "/metrics.jsonl"),
                "which this command reads; writing it would destroy it");
  ExpectOneLine(RunCommand(kKeel + " report " + run + " --out " + run + "/./metrics.jsonl"),
                "which this command reads");
  EXPECT_EQ(ReadFile(run + "/metrics.jsonl"), metrics);
  std::ofstream(run + "/model.safetensors") << "weights";
  ExpectOneLine(RunCommand(kKeel + " report " + run + " --out " + run + "/model.safetensors"),
                "exists and is not an HTML report; refusing to overwrite it");
  EXPECT_EQ(ReadFile(run + "/model.safetensors"), "weights");
  ExpectOneLine(RunCommand(kKeel + " report " + run + " --png-size 0"),
                "keel report --png-size: expected a number in [100, 10000], got 0");
  ExpectOneLine(RunCommand(kKeel + " report " + run + " --png-size -3"), "got -3");

  // The report has every line under 1 MiB (1, 3 and 5) and says 3 were skipped (the two long
  // ones and the damaged event); a second report over the first is allowed.
  for (int i = 0; i < 2; ++i) {
    const RunResult r = RunCommand(kKeel + " report " + run + " --out " + (dir / "r.html"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.err.find("3 line(s) skipped (not JSON, or over 1 MiB)"), std::string::npos)
        << r.err;
  }
  const std::string html = ReadFile(dir / "r.html");
  EXPECT_NE(html.find("\"skipped\":3"), std::string::npos);
  for (const char* step : {"\"step\":1", "\"step\":3", "\"step\":5"})
    EXPECT_NE(html.find(step), std::string::npos) << step;
}

TEST(ReportCli, AFifoIsRefusedNotReadForever) {
  TempDir dir;
  const std::string run = dir / "run";
  std::filesystem::create_directories(run);
  ASSERT_EQ(::mkfifo((run + "/metrics.jsonl").c_str(), 0644), 0);
  const RunResult r = RunCommand("timeout 20 " + kKeel + " report " + run);
  ExpectOneLine(r, run + "/metrics.jsonl: expected a regular file, found a FIFO (named pipe)");
  ExpectOneLine(RunCommand("timeout 20 " + kKeel + " dashboard " + run + " --port 0"),
                "found a FIFO");
}

TEST(DashboardCli, AddressesAndPortsAreChecked) {
  TempDir dir;
  const std::string run = RunWithLongLines(dir);
  ExpectOneLine(RunCommand(kKeel + " dashboard " + run + " --addr 999.1.1.1"),
                "keel dashboard --addr: \"999.1.1.1\" is not an address to listen on");
  ExpectOneLine(RunCommand(kKeel + " dashboard " + run + " --port 70000"),
                "keel dashboard --port: expected a number in [0, 65535], got 70000");
  ExpectOneLine(RunCommand(kKeel + " dashboard " + run + " --addr 0.0.0.0"), "pass --token too");
}

}  // namespace
}  // namespace keel::test

// Issues 32 and 33, for `keel train` and `keel eval`: addresses, URLs and KEEL_FAULT specs are
// checked before anything is written (one line, exit 2, naming the key or the variable and the bad
// part); a metrics port in use is refused before the run folder exists; a run folder has one job at
// a time, and a lock left by a dead holder is taken over with a line saying so.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "keel/ckpt/model_file.h"
#include "keel/model/params.h"
#include "run_util.h"

namespace keel::test {
namespace {

const std::string kKeel = KEEL_BINARY;
const std::string kTiny = std::string(KEEL_SOURCE_DIR) + "/configs/test-tiny.toml";

std::string Tokens(const TempDir& dir) {
  const std::string all = ReadFile(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.u16");
  EXPECT_GT(all.size(), 200000u) << "missing ../shared/data/brown/brown.gpt2.u16";
  const std::string path = dir / "brown.u16";
  std::ofstream(path, std::ios::binary).write(all.data(), 200000);
  return path;
}

std::string Train(const TempDir& dir, const std::string& data, const std::string& extra) {
  return "OMP_NUM_THREADS=1 " + kKeel + " train " + kTiny + " --set data.train=" + data +
         " --set train.out_dir=" + dir.path() + " " + extra;
}

void ExpectRefusedBeforeWriting(const RunResult& r, const TempDir& dir, const std::string& want,
                                const std::string& what) {
  EXPECT_EQ(r.code, 2) << what << ": " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << what << ": want " << want << ": " << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "test-tiny")) << what << ": the run folder exists";
}

TEST(TrainInput, AddressesUrlsAndFaultSpecsAreRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  const std::string data = Tokens(dir);
  struct Case {
    std::string env, args, want;
  };
  const std::vector<Case> cases = {
      {"", "--set monitor.metrics_addr=999.1.1.1 --set monitor.metrics_port=9", "\"999.1.1.1\""},
      {"", "--set monitor.metrics_addr=1.2.3", "monitor.metrics_addr: \"1.2.3\" is not an address"},
      {"", "--set monitor.alerts.webhook=http://:8080/x", "webhook: \"http://:8080/x\": no host"},
      {"", "--set monitor.alerts.webhook=http://example.com:99999/x", "not in 1-65535"},
      {"", "--set monitor.alerts.webhook=ftp://example.com/", "not http or https"},
      {"KEEL_FAULT='boom@3'", "", "KEEL_FAULT: \"boom@3\": unknown kind \"boom\""},
      {"KEEL_FAULT='kill@-1'", "", "KEEL_FAULT: \"kill@-1\": step: expected a whole number"},
      {"KEEL_FAULT='hang@2,phase=lunch'", "", "phase: expected data, forward, backward"},
      {"KEEL_FAULT='kill@2:0x'", "", "rank: expected a whole number >= 0, got \"0x\""},
      {"KEEL_FAULT='kill@99999999999'", "", "step: expected a whole number"},
      {"KEEL_FAULT='kill@2,phase=forward'", "", "phase applies to hang faults only, not kill"},
      {"KEEL_FAULT='kill@2:3'", "", "rank 3: the job has 1 rank(s)"},
      {"KEEL_FAULT='nan_grad@500'", "--set train.steps=5", "step 500: the run has 5 steps"},
      {"KEEL_FAULT='bitflip@1,param=h.9.nope'", "", "param=h.9.nope: no such parameter"},
      // Issue 33: a run name must be a folder name on every file system.
      {"", "--set \"train.name=$(printf 'a\\nb')\"", "contains a control character (byte 10)"},
      {"", "--set train.name='a:b'", "train.name: contains ':'"},
  };
  for (const Case& c : cases)
    ExpectRefusedBeforeWriting(RunCommand(c.env + " " + Train(dir, data, c.args)), dir, c.want,
                               c.env + c.args);
}

// A port another process listens on: refused before the run folder is created.
TEST(TrainInput, MetricsPortInUseIsRefusedFirst) {
  TempDir dir;
  const std::string data = Tokens(dir);
  TakenPort taken;
  const std::string port = taken.port();
  ASSERT_FALSE(port.empty());
  ExpectRefusedBeforeWriting(
      RunCommand(Train(dir, data, "--set monitor.metrics_port=" + port)), dir,
      "[monitor] metrics_port " + port + ": cannot listen on 127.0.0.1:" + port, "port in use");
  taken.Free();
  // Free again: the run binds it and says where.
  const RunResult r =
      RunCommand(Train(dir, data, "--set train.steps=1 --set monitor.metrics_port=" + port));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE((r.out + r.err).find("Prometheus metrics at http://127.0.0.1:" + port + "/metrics"),
            std::string::npos)
      << r.out << r.err;
}

// A second job on a run folder that a first is training: exit 2 naming the first's pid, and
// nothing of the first's changed. Once the first is gone, the folder is free again; a lock left
// by a holder that died is taken over with a line saying so.
TEST(TrainInput, ARunFolderHasOneJobAtATime) {
  TempDir dir;
  const std::string data = Tokens(dir);
  const std::string run = dir / "test-tiny", metrics = run + "/metrics.jsonl";
  const std::string pid_file = dir / "first.pid";
  ASSERT_EQ(RunCommand("(" + Train(dir, data, "--set train.steps=100000") + " >" +
                       (dir / "first.log") + " 2>&1 & echo $! >" + pid_file + ")")
                .code,
            0);
  const std::string pid = ReadFile(pid_file).substr(0, ReadFile(pid_file).find('\n'));
  RunCommand("for i in $(seq 600); do [ -s " + metrics + " ] && break; sleep 0.1; done");
  ASSERT_TRUE(std::filesystem::exists(metrics)) << ReadFile(dir / "first.log");
  const std::string config = ReadFile(run + "/config.toml");
  const RunResult second = RunCommand(Train(dir, data, "--set train.steps=3 --set optim.lr=1"));
  EXPECT_EQ(second.code, 2) << second.err;
  EXPECT_NE(second.err.find("is in use by another keel job (host "), std::string::npos)
      << second.err;
  EXPECT_NE(second.err.find("pid " + pid + ")"), std::string::npos) << second.err;
  EXPECT_EQ(ReadFile(run + "/config.toml"), config) << "the second job rewrote the first's config";
  const RunResult into = RunCommand(kKeel + " ckpt export " + run + " --out " + run + "/hf");
  EXPECT_EQ(into.code, 2) << into.err;
  EXPECT_NE(into.err.find("inside " + run + ", a run folder that a keel job is training (host "),
            std::string::npos)
      << into.err;
  EXPECT_FALSE(std::filesystem::exists(run + "/hf"));
  RunCommand("kill -INT " + pid + "; while kill -0 " + pid + " 2>/dev/null; do sleep 0.1; done");

  // The first stopped cleanly: no holder left behind, and the folder takes a new job.
  EXPECT_EQ(ReadFile(run + "/.keel.lock"), "");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::filesystem::create_directories(dir / "y");
  std::ofstream(dir / "y/.keel.lock") << "host " << host << ", pid 999999\n";
  const RunResult taken = RunCommand(Train(dir, data, "--set train.steps=1 --set train.name=y"));
  EXPECT_EQ(taken.code, 0) << taken.err;
  EXPECT_NE(taken.err.find("taking over the lock of host " + std::string(host) +
                           ", pid 999999 (no longer running)"),
            std::string::npos)
      << taken.err;
}

// keel eval sizes its buffers before allocating them (a huge --batch was std::bad_alloc, exit 1),
// and a loss that is not a number is an error (exit 1), not a result printed with exit 0.
TEST(EvalInput, HugeBatchIsSizedAndANonFiniteLossIsAnError) {
  TempDir dir;
  const std::string data = Tokens(dir);
  const model::ModelConfig cfg = model::NamedConfig("gpt2-tiny");
  const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
  std::vector<float> w(layout.total());
  model::InitParams(layout, cfg, 1, w.data());
  const std::string ok = dir / "ok.safetensors", big = dir / "big.safetensors";
  ckpt::WriteModel(ok, cfg, layout, w.data());
  const model::ParamInfo& proj = layout.Find("h.0.attn.c_proj.weight");
  std::fill_n(w.begin() + long(proj.offset), proj.numel, 3e38f);  // finite, but overflows
  ckpt::WriteModel(big, cfg, layout, w.data());
  const std::string eval = "OMP_NUM_THREADS=1 " + kKeel + " eval ";
  const RunResult huge = RunCommand(eval + ok + " --data " + data + " --batch 100000000");
  EXPECT_EQ(huge.code, 2) << huge.err;
  EXPECT_NE(huge.err.find("eval: --batch 100000000 windows of --seq-len"), std::string::npos)
      << huge.err;
  EXPECT_NE(huge.err.find("GiB of memory; this machine has"), std::string::npos) << huge.err;
  const RunResult nan = RunCommand(eval + big + " --data " + data + " --max-tokens 2000");
  EXPECT_EQ(nan.code, 1) << nan.err;
  EXPECT_NE(nan.err.find("the weights are finite: the forward overflowed"), std::string::npos)
      << nan.err;
  EXPECT_EQ(RunCommand(eval + ok + " --data " + data + " --max-tokens 2000").code, 0);
}

}  // namespace
}  // namespace keel::test

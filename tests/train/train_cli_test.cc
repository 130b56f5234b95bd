// `keel train` and `keel generate` end to end on a tiny model: the run directory, determinism,
// pinned losses, and one clear line with exit code 2 for each kind of bad input.
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "run_util.h"

namespace keel::test {
namespace {

const std::string kKeel = KEEL_BINARY;
const std::string kTiny = std::string(KEEL_SOURCE_DIR) + "/configs/test-tiny.toml";

// The first 200,000 reference GPT-2 tokens of the Brown corpus as a flat uint16 file.
std::string FlatTokens(const TempDir& dir) {
  std::string all = ReadFile(std::string(KEEL_SHARED_DATA) + "/brown/brown.gpt2.u16");
  EXPECT_GT(all.size(), 400000u) << "missing ../shared/data/brown/brown.gpt2.u16";
  std::string path = dir / "brown.u16";
  std::ofstream(path, std::ios::binary).write(all.data(), 400000);
  return path;
}

std::string TrainCmd(const TempDir& dir, const std::string& data, const std::string& extra) {
  return "OMP_NUM_THREADS=2 " + kKeel + " train " + kTiny + " --set data.train=" + data +
         " --set train.out_dir=" + dir.path() + " " + extra;
}

TEST(TrainCli, TinyRunWritesItsRunDirectoryAndLearns) {
  TempDir dir;
  auto data = FlatTokens(dir);
  auto r = TrainCmd(dir, data, "--set train.steps=30 --set optim.lr=1e-2");
  auto res = RunCommand(r);
  ASSERT_EQ(res.code, 0) << res.err;
  const std::string run = dir / "test-tiny";
  EXPECT_TRUE(std::filesystem::exists(run + "/config.toml"));
  EXPECT_TRUE(std::filesystem::exists(run + "/model.safetensors"));
  auto losses = Losses(run + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_NEAR(losses[0], std::log(50257.0), 0.3);
  double tail = 0;
  for (size_t i = losses.size() - 5; i < losses.size(); ++i) tail += losses[i] / 5;
  EXPECT_LT(tail, losses[0] - 1.5) << "the loss did not fall";
  EXPECT_NE(res.out.find("step    30/30"), std::string::npos) << res.out;

  auto gen = RunCommand(kKeel + " generate --run " + run + " --prompt 'The' --max-tokens 8");
  EXPECT_EQ(gen.code, 0) << gen.err;
  EXPECT_EQ(gen.out.rfind("The", 0), 0u) << gen.out;
}

// Same config, seed and thread count: bitwise the same run. The first losses are pinned: a
// change that moves them must say why (and update the numbers).
TEST(TrainCli, RunsAreBitwiseRepeatableAndPinned) {
  TempDir a, b;
  auto data = FlatTokens(a);
  const std::string args = "--set train.steps=5 --set optim.lr=1e-2";
  ASSERT_EQ(RunCommand(TrainCmd(a, data, args)).code, 0);
  ASSERT_EQ(RunCommand(TrainCmd(b, data, args)).code, 0);
  auto la = Losses(a / "test-tiny/metrics.jsonl"), lb = Losses(b / "test-tiny/metrics.jsonl");
  ASSERT_EQ(la.size(), 5u);
  EXPECT_EQ(la, lb);
  // gpt2-tiny, fp32, seed 1337, the first 200k Brown tokens (same with 1 and 2 threads).
  const std::vector<double> pinned = {10.822013, 10.827553, 10.767600, 10.719553, 10.663822};
  for (size_t i = 0; i < pinned.size(); ++i) EXPECT_NEAR(la[i], pinned[i], 2e-4) << "step " << i;
}

// Ctrl-C (SIGINT) finishes the current step, saves a checkpoint and model.safetensors, exits 0.
TEST(TrainCli, InterruptSavesTheModelAndExitsZero) {
  TempDir dir;
  auto data = FlatTokens(dir);
  const std::string metrics = dir / "test-tiny/metrics.jsonl";
  const std::string cmd = TrainCmd(dir, data, "--set train.steps=100000") + " & pid=$!; " +
                          "for i in $(seq 600); do [ -f " + metrics + " ] && [ $(wc -l < " +
                          metrics +
                          ") -ge 2 ] && break; sleep 0.1; done; kill -INT $pid; wait $pid";
  auto res = RunCommand("(" + cmd + ")");
  EXPECT_EQ(res.code, 0) << res.err;
  EXPECT_TRUE(std::filesystem::exists(dir / "test-tiny/model.safetensors"));
  EXPECT_NE(res.out.find("interrupted"), std::string::npos) << res.out;
  // The hint continues this run: its config.toml holds the --set flags as resolved.
  EXPECT_NE(res.out.find("continue with: keel train " + (dir / "test-tiny") +
                         "/config.toml --resume auto"),
            std::string::npos)
      << res.out;
  const std::string resolved = ReadFile(dir / "test-tiny/config.toml");
  EXPECT_NE(resolved.find("steps = 100000"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find(data), std::string::npos) << resolved;
  // The checkpoint of the step it stopped at is committed and `latest` names it.
  const auto ckpts = dir / "test-tiny/checkpoints";
  std::ifstream latest(ckpts + "/latest");
  std::string name;
  ASSERT_TRUE(latest >> name) << res.err;
  EXPECT_TRUE(std::filesystem::exists(ckpts + "/" + name + "/COMMIT")) << name;
  EXPECT_EQ(RunCommand(kKeel + " ckpt verify " + ckpts + "/" + name).code, 0);
}

// A resume under another learning-rate schedule (train.steps raised to go on, as a finished run
// is told to) says so once, with the lr the next step takes under each; one under the same says
// nothing.
TEST(TrainCli, AResumeUnderAnotherScheduleSaysSo) {
  TempDir dir;
  auto data = FlatTokens(dir);
  const std::string args = "--set optim.warmup_steps=1 --set checkpoint.every_steps=2 ";
  ASSERT_EQ(
      RunCommand(TrainCmd(dir, data, args + "--set train.steps=4 --set train.stop_at=2")).code, 0);
  auto same = RunCommand(TrainCmd(dir, data, args + "--set train.steps=4 --resume auto"));
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(same.err.find("schedule differs"), std::string::npos) << same.err;
  auto longer = RunCommand(TrainCmd(dir, data, args + "--set train.steps=8 --resume auto"));
  ASSERT_EQ(longer.code, 0) << longer.err;
  EXPECT_NE(longer.err.find("the learning-rate schedule differs from the checkpoint's "
                            "(total_steps 4 -> 8): step 5 trains at lr"),
            std::string::npos)
      << longer.err;
  const std::string events = ReadFile(dir / "test-tiny/events.jsonl");
  EXPECT_NE(events.find("\"event\":\"schedule_changed\""), std::string::npos) << events;
}

// Resumes that do not fit the run are refused with one line, before anything is written: another
// model shape, train.steps below the checkpoint, a stop_at already passed. A finished run says
// there is nothing left to train and leaves its outputs as they are.
TEST(TrainCli, ResumesThatDoNotFitAreRefused) {
  TempDir dir;
  auto data = FlatTokens(dir);
  const std::string run = dir / "test-tiny";
  const auto first = RunCommand(TrainCmd(dir, data, "--set train.steps=4"));
  ASSERT_EQ(first.code, 0) << first.err;
  // The default warmup (10 steps) is longer than this run: said, not refused.
  EXPECT_NE(first.err.find("warmup_steps = 10 is not below train.steps = 4"), std::string::npos)
      << first.err;
  const std::string metrics = ReadFile(run + "/metrics.jsonl");
  struct Case {
    const char* args;
    const char* want;
  };
  const Case cases[] = {
      {"--set model.n_layer=1 --set train.steps=6",
       "the checkpoint is of another model: model.n_layer = 2 there, 1 in this run's config"},
      {"--set model.n_head=1 --set train.steps=6",
       "the checkpoint is of another model: model.n_head = 2 there, 1 in this run's config"},
      {"--set train.steps=2", "[train] steps: 2 is below the step of the checkpoint resumed"},
      {"--set train.steps=8 --set train.stop_at=3", "[train] stop_at: 3 is already passed"},
  };
  for (const Case& c : cases) {
    auto res = RunCommand(TrainCmd(dir, data, std::string(c.args) + " --resume auto"));
    EXPECT_EQ(res.code, 2) << c.args << "\n" << res.err;
    EXPECT_NE(res.err.find(c.want), std::string::npos) << c.args << "\n" << res.err;
    EXPECT_EQ(ReadFile(run + "/metrics.jsonl"), metrics) << c.args;
  }
  auto done = RunCommand(TrainCmd(dir, data, "--set train.steps=4 --resume auto"));
  EXPECT_EQ(done.code, 0) << done.err;
  EXPECT_NE(done.out.find("already trained to step 4 of train.steps = 4"), std::string::npos)
      << done.out;
  EXPECT_EQ(done.out.find("final train loss"), std::string::npos) << done.out;
  EXPECT_EQ(ReadFile(run + "/metrics.jsonl"), metrics);
  EXPECT_TRUE(std::filesystem::exists(run + "/model.safetensors"));

  // A manifest missing a tensor, with a COMMIT that matches it: verify refuses it as resume does.
  const std::string ck = run + "/checkpoints/step_00000004";
  nlohmann::json m = nlohmann::json::parse(ReadFile(ck + "/manifest.json"));
  auto& tensors = m["tensors"];
  for (auto it = tensors.begin(); it != tensors.end(); ++it)
    if ((*it)["name"] == "h.1.ln_2.bias") {
      tensors.erase(it);
      break;
    }
  const std::string text = m.dump(1);
  std::ofstream(ck + "/manifest.json", std::ios::binary) << text;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(text.data(), text.size())));
  std::ofstream(ck + "/COMMIT") << "xxh3 " << hex << "\n";
  auto verify = RunCommand(kKeel + " ckpt verify " + ck);
  EXPECT_NE(verify.code, 0) << verify.out;
  EXPECT_NE((verify.out + verify.err).find("no tensor h.1.ln_2.bias"), std::string::npos)
      << verify.out << verify.err;
}

// Outputs that cannot be written (here a file-size limit; a full disk fails the same way) are
// reported once, never left half-written, and the run ends with exit 1 saying what was lost.
TEST(TrainCli, OutputsThatCannotBeWrittenFailTheRunWithWholeLines) {
  TempDir dir;
  auto data = FlatTokens(dir);
  auto res =
      RunCommand("ulimit -f 24 && " +
                 TrainCmd(dir, data,
                          "--set train.steps=200 --set checkpoint.every_minutes=0 "
                          "--set checkpoint.at_end=false --set checkpoint.save_final=false"));
  EXPECT_EQ(res.code, 1) << res.err;
  const std::string metrics = dir / "test-tiny/metrics.jsonl";
  size_t warnings = 0;
  for (size_t at = 0; (at = res.err.find("keel: warning: cannot write", at)) != std::string::npos;
       ++at)
    ++warnings;
  EXPECT_EQ(warnings, 1u) << res.err;
  EXPECT_NE(res.err.find("the run trained to step 200 but its outputs are incomplete: could not "
                         "write"),
            std::string::npos)
      << res.err;
  EXPECT_NE(res.err.find(metrics), std::string::npos) << res.err;
  const std::string text = ReadFile(metrics);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a line was left half-written";
  size_t lines = 0;
  for (size_t a = 0, b; (b = text.find('\n', a)) != std::string::npos; a = b + 1, ++lines)
    EXPECT_NO_THROW((void)nlohmann::json::parse(text.substr(a, b - a))) << "line " << lines;
  EXPECT_GT(lines, 10u);
  EXPECT_LT(lines, 200u);
}

// [checkpoint] every_minutes saves on rank 0's clock, in the middle of a run.
TEST(TrainCli, EveryMinutesSavesDuringTheRun) {
  TempDir dir;
  auto data = FlatTokens(dir);
  auto res = RunCommand(TrainCmd(dir, data,
                                 "--set train.steps=60 --set checkpoint.every_minutes=0.002 "
                                 "--set checkpoint.at_end=false --set checkpoint.keep_last=100"));
  ASSERT_EQ(res.code, 0) << res.err;
  int saves = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "test-tiny/checkpoints"))
    saves += e.path().filename().string().rfind("step_", 0) == 0;
  EXPECT_GE(saves, 1) << res.err;
  EXPECT_NE(res.err.find("keel: checkpoint "), std::string::npos) << res.err;
}

struct BadCase {
  std::string name, args, expect;
};

// Each bad input: exit code 2, one line naming what is wrong, and no run directory that looks
// like a run (no config.toml, no model.safetensors).
TEST(TrainCli, BadInputGetsOneClearLineAndExitCode2) {
  TempDir dir;
  auto data = FlatTokens(dir);
  std::string odd = dir / "odd.u16";
  std::ofstream(odd, std::ios::binary).write("abc", 3);
  std::string big = dir / "big.u16";
  {
    std::vector<uint16_t> toks(5000, 100);
    toks[4321] = 60000;
    std::ofstream(big, std::ios::binary)
        .write(reinterpret_cast<const char*>(toks.data()), toks.size() * 2);
  }
  const std::vector<BadCase> cases = {
      {"unknown key", "--set train.stepz=3", "stepz"},
      {"wrong type", "--set train.steps=abc", "steps"},
      {"n_embd", "--set model.n_embd=33", "n_embd"},
      {"batch", "--set train.batch_size=6 --set train.micro_batch_size=4", "batch_size"},
      {"seq_len", "--set data.seq_len=65", "seq_len"},
      {"lr nan", "--set optim.lr=nan", "lr"},
      {"lr inf", "--set optim.lr=inf", "lr"},
      {"missing file", "--set data.train=" + dir.path() + "/nope.u16", "nope.u16"},
      {"truncated file", "--set data.train=" + odd, "odd.u16"},
      {"token id", "--set data.train=" + big, "big.u16"},
      {"run name path", "--set train.name=../../x", "\"../../x\" is a path"},
      // Sizes no machine has: refused before allocating, naming the largest item.
      {"huge batch", "--set train.batch_size=1000000000", "the activations of micro-batches of "},
      {"huge width", "--set model.n_embd=1000000000", "the weights, gradients and fp32 master"},
      {"huge depth", "--set model.n_layer=100000000", "model.n_layer 100000000"},
      {"huge prefetch", "--set data.prefetch=1000000000", "data.prefetch = 1000000000"},
  };
  for (const auto& c : cases) {
    std::string cmd = "OMP_NUM_THREADS=2 " + kKeel + " train " + kTiny +
                      " --set data.train=" + data + " --set train.out_dir=" + dir.path() + " " +
                      c.args;
    auto res = RunCommand(cmd);
    EXPECT_EQ(res.code, 2) << c.name << ": " << res.err;
    EXPECT_NE(res.err.find(c.expect), std::string::npos) << c.name << ": " << res.err;
    EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << c.name << ": " << res.err;
    EXPECT_FALSE(std::filesystem::exists(dir / "test-tiny/config.toml")) << c.name;
    EXPECT_FALSE(std::filesystem::exists(dir / "test-tiny/model.safetensors")) << c.name;
  }
}

// KEEL_CPU_ISA picks a narrower set of kernels (kernels/cpu_isa.h); a word it does not know is one
// line and exit 2, and the run says which set it chose beside the peak.
TEST(TrainCli, KernelIsaIsChosenOnceAndNamed) {
  TempDir dir;
  auto data = FlatTokens(dir);
  auto bad = RunCommand("KEEL_CPU_ISA=avx1024 " + TrainCmd(dir, data, "--set train.steps=1"));
  EXPECT_EQ(bad.code, 2) << bad.err;
  EXPECT_NE(bad.err.find("KEEL_CPU_ISA=avx1024: expected x86-64-v2, avx2 or avx512"),
            std::string::npos)
      << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "test-tiny/config.toml"));
  auto base = RunCommand("KEEL_CPU_ISA=x86-64-v2 " + TrainCmd(dir, data, "--set train.steps=2"));
  EXPECT_EQ(base.code, 0) << base.err;
  EXPECT_NE((base.out + base.err).find("; kernels: x86-64-v2"), std::string::npos)
      << base.out << base.err;
}

// A [parallel] layout that cannot run on the ranks launched (here one process): exit 2 with one
// line naming the key, before anything is written.
TEST(TrainCli, BadParallelLayoutGetsOneLineAndExitCode2) {
  TempDir dir;
  auto data = FlatTokens(dir);
  const std::vector<BadCase> cases = {
      {"zero stage", "--set parallel.zero=4", "zero"},
      {"dp over 1 rank", "--set parallel.dp=3", "ranks"},
  };
  for (const auto& c : cases) {
    auto res = RunCommand(TrainCmd(dir, data, c.args));
    EXPECT_EQ(res.code, 2) << c.name << ": " << res.err;
    EXPECT_NE(res.err.find(c.expect), std::string::npos) << c.name << ": " << res.err;
    EXPECT_EQ(std::count(res.err.begin(), res.err.end(), '\n'), 1) << c.name << ": " << res.err;
    EXPECT_FALSE(std::filesystem::exists(dir / "test-tiny/config.toml")) << c.name;
  }
}

TEST(TrainCli, TokenIdErrorNamesTheOffset) {
  TempDir dir;
  std::string big = dir / "big.u16";
  std::vector<uint16_t> toks(5000, 100);
  toks[4321] = 60000;
  std::ofstream(big, std::ios::binary)
      .write(reinterpret_cast<const char*>(toks.data()), toks.size() * 2);
  auto res = RunCommand(TrainCmd(dir, big, ""));
  EXPECT_EQ(res.code, 2);
  EXPECT_NE(res.err.find("4321"), std::string::npos) << res.err;
}

// Two weighted [[data.sources]]: the run trains, logs each source with its weight, and writes the
// sources back into the run directory's config.toml.
TEST(TrainCli, BlendedSourcesTrain) {
  TempDir dir;
  std::string all = ReadFile(FlatTokens(dir));
  const std::string a = dir / "a.u16", b = dir / "b.u16";
  std::ofstream(a, std::ios::binary).write(all.data(), 200000);
  std::ofstream(b, std::ios::binary).write(all.data() + 200000, 200000);
  const std::string cfg = dir / "blend.toml";
  std::ofstream(cfg) << ReadFile(kTiny) << "\n[[data.sources]]\npath = \"" << a
                     << "\"\nweight = 0.7\n\n[[data.sources]]\npath = \"" << b
                     << "\"\nweight = 0.3\n";
  auto res = RunCommand("OMP_NUM_THREADS=2 " + kKeel + " train " + cfg +
                        " --set train.steps=4 --set train.out_dir=" + dir.path());
  ASSERT_EQ(res.code, 0) << res.err;
  const std::string log = res.out + res.err;
  EXPECT_NE(log.find("data source 0: " + a + ", weight 0.7"), std::string::npos) << log;
  EXPECT_NE(log.find("data source 1: " + b + ", weight 0.3"), std::string::npos) << log;
  const std::string run = dir / "test-tiny";
  EXPECT_EQ(Losses(run + "/metrics.jsonl").size(), 4u);
  const std::string written = ReadFile(run + "/config.toml");
  EXPECT_NE(written.find("[[data.sources]]\npath = \"" + b + "\"\nweight = 0.3"), std::string::npos)
      << written;
}

TEST(TrainCli, HelpExplainsTrain) {
  auto res = RunCommand(kKeel + " help train");
  EXPECT_EQ(res.code, 0);
  EXPECT_NE(res.out.find("keel train configs/quickstart.toml"), std::string::npos) << res.out;
  EXPECT_EQ(RunCommand(kKeel + " help nosuchverb").code, 2);
}

TEST(GenerateCli, MissingRunIsBadInput) {
  auto res = RunCommand(kKeel + " generate --run /nonexistent --prompt hi");
  EXPECT_EQ(res.code, 2);
  EXPECT_NE(res.err.find("/nonexistent"), std::string::npos) << res.err;
}

TEST(Cli, UnknownVerbIsNamed) {
  auto res = RunCommand(kKeel + " frobnicate");
  EXPECT_EQ(res.code, 2);
  EXPECT_NE(res.err.find("unknown verb \"frobnicate\" (known: train, generate"), std::string::npos)
      << res.err;
}

// Sampling arguments out of range are refused; a request past the context says where it stopped;
// a run whose newest checkpoint is corrupt generates from the newest good one, saying so (as
// resume does); export creates the folder it writes into (as import does).
TEST(GenerateCli, ArgumentsContextAndCorruptCheckpoints) {
  TempDir dir;
  auto data = FlatTokens(dir);
  ASSERT_EQ(
      RunCommand(TrainCmd(dir, data, "--set train.steps=4 --set checkpoint.every_steps=2")).code,
      0);
  const std::string run = dir / "test-tiny";
  const std::string gen = kKeel + " generate --run " + run + " --prompt The ";
  for (const char* bad : {"--temperature nan", "--temperature inf", "--count -1", "--count 0"}) {
    auto res = RunCommand(gen + bad);
    EXPECT_EQ(res.code, 2) << bad;
    EXPECT_NE(res.err.find("generate: expected --max-tokens >= 0"), std::string::npos) << res.err;
  }
  auto longer = RunCommand(gen + "--max-tokens 100000 --temperature 0");
  EXPECT_EQ(longer.code, 0) << longer.err;
  EXPECT_NE(longer.err.find("at the model's context of 64"), std::string::npos) << longer.err;
  const auto good = RunCommand(kKeel + " generate --run " + run +
                               "/checkpoints/step_00000002 --prompt The --temperature 0");
  ASSERT_EQ(good.code, 0) << good.err;
  // Corrupt the newest checkpoint's first data file: its pieces no longer match their xxh3.
  for (const auto& e : std::filesystem::directory_iterator(run + "/checkpoints/step_00000004"))
    if (e.path().extension() == ".bin") {
      std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      f.write("XXXX", 4);
    }
  auto fallback = RunCommand(gen + "--temperature 0");
  EXPECT_EQ(fallback.code, 0) << fallback.err;
  EXPECT_NE(fallback.err.find("skipping checkpoint " + run + "/checkpoints/step_00000004"),
            std::string::npos)
      << fallback.err;
  EXPECT_EQ(fallback.out, good.out);
  auto exported =
      RunCommand(kKeel + " ckpt export " + run + " --out " + (dir / "new/folder/m.safetensors"));
  EXPECT_EQ(exported.code, 0) << exported.err;
  EXPECT_TRUE(std::filesystem::exists(dir / "new/folder/m.safetensors"));
}

// A checkpoint folder and the model file of the same step generate the same text.
TEST(GenerateCli, CheckpointAndModelFileGiveTheSameText) {
  TempDir dir;
  auto data = FlatTokens(dir);
  ASSERT_EQ(RunCommand(TrainCmd(dir, data, "--set train.steps=5 --set train.sample_count=0")).code,
            0);
  const std::string run = dir / "test-tiny";
  const std::string gen = kKeel + " generate --prompt The --max-tokens 8 --temperature 0 --run ";
  auto from_file = RunCommand(gen + run + "/model.safetensors");
  auto from_ckpt = RunCommand(gen + run + "/checkpoints/step_00000005");
  ASSERT_EQ(from_file.code, 0) << from_file.err;
  ASSERT_EQ(from_ckpt.code, 0) << from_ckpt.err;
  EXPECT_GT(from_file.out.size(), 4u);
  EXPECT_EQ(from_file.out, from_ckpt.out);
}

}  // namespace
}  // namespace keel::test

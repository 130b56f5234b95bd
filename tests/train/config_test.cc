// Tests of the run configuration (train/config.h): defaults, file values, --set overrides, the
// ToToml round trip, and one test per kind of bad input, each checking that the message names the
// file or flag and the key, and that the exit code is "bad input".
#include "keel/train/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "../bad_input.h"
#include "keel/core/error.h"
#include "keel/model/params.h"

namespace keel::train {
namespace {

namespace fs = std::filesystem;

// Writes `text` to a file named `name` in a fresh temporary folder and returns its path.
std::string WriteConfig(const std::string& name, const std::string& text) {
  fs::path dir = fs::path(::testing::TempDir()) / "keel_config_test";
  fs::create_directories(dir);
  fs::path path = dir / name;
  std::ofstream(path) << text;
  return path.string();
}

std::string LoadError(const std::string& name, const std::string& text,
                      const std::vector<std::string>& overrides = {}) {
  std::string path = WriteConfig(name, text);
  return BadInputMessage([&] { LoadConfig(path, overrides); });
}

TEST(Config, DefaultsLoadWithoutFile) {
  RunConfig cfg = LoadConfig("", {});
  EXPECT_EQ(cfg, RunConfig{});
  model::ModelConfig m = cfg.ResolvedModel();
  EXPECT_EQ(m.n_layer, 4);
  EXPECT_EQ(m.n_embd, 256);
}

TEST(Config, FileValuesReplaceDefaults) {
  std::string path = WriteConfig("values.toml", R"(
[model]
name = "gpt2-tiny"
n_layer = 3
recompute = "attn"

[data]
train = "data/x/train"
seq_len = 16

[train]
name = "exp"
precision = "fp32"
seed = 7

[optim]
lr = 1          # an integer where a float is expected is accepted
schedule = "linear"

[checkpoint]
save_final = false

[monitor]
peak_gflops = 100
)");
  RunConfig cfg = LoadConfig(path, {});
  EXPECT_EQ(cfg.source, path);
  EXPECT_EQ(cfg.model.name, "gpt2-tiny");
  EXPECT_EQ(cfg.model.recompute, "attn");
  EXPECT_EQ(cfg.data.train, "data/x/train");
  EXPECT_EQ(cfg.data.seq_len, 16);
  EXPECT_EQ(cfg.train.name, "exp");
  EXPECT_EQ(cfg.train.precision, "fp32");
  EXPECT_EQ(cfg.train.seed, 7u);
  EXPECT_EQ(cfg.optim.lr, 1.0f);
  EXPECT_EQ(cfg.optim.schedule, "linear");
  EXPECT_FALSE(cfg.checkpoint.save_final);
  EXPECT_EQ(cfg.monitor.peak_gflops, 100.0);
  EXPECT_EQ(cfg.train.steps, TrainSection{}.steps);  // untouched keys keep their defaults

  model::ModelConfig m = cfg.ResolvedModel();
  EXPECT_EQ(m.n_layer, 3);  // explicit override of the named config
  EXPECT_EQ(m.n_head, 2);   // from gpt2-tiny
}

TEST(Config, OverridesApplyAfterFile) {
  std::string path = WriteConfig("over.toml", "[optim]\nlr = 0.01\n[train]\nname = \"a\"\n");
  RunConfig cfg = LoadConfig(path, {"optim.lr=1e-3", "train.precision=fp32", "train.name=\"x y\"",
                                    "checkpoint.save_final=false", " train.steps = 5 ",
                                    "data.train=data/brown/train", "train.out_dir=2024"});
  EXPECT_EQ(cfg.optim.lr, 1e-3f);
  EXPECT_EQ(cfg.train.precision, "fp32");
  EXPECT_EQ(cfg.train.name, "x y");
  EXPECT_FALSE(cfg.checkpoint.save_final);
  EXPECT_EQ(cfg.train.steps, 5);
  EXPECT_EQ(cfg.data.train, "data/brown/train");
  EXPECT_EQ(cfg.train.out_dir, "2024");  // a string key takes a bare number as text
}

TEST(Config, ToTomlRoundTripsEveryValue) {
  RunConfig a;
  a.model = {"gpt2-tiny", 3, 4, 64, 1000, 48, 0, 0, 0, "full", 0.015f, "w/model.safetensors"};
  a.data = {"d/train", "d/val", 24, 5, {}};
  a.train.name = "ünïcode-run_1.b";  // a folder name anywhere (config_validate.cc)
  a.train.out_dir = "out";
  a.train.steps = 12;
  a.train.batch_size = 6;
  a.train.micro_batch_size = 3;
  a.train.precision = "fp32";
  a.train.seed = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  a.train.val_every = 0;
  a.train.sample_prompt = "quote\" back\\slash tab\t ünïcode";  // TOML's escapes
  a.optim = {3e-4f,  0.1f * 3e-4f, 7,    "constant", 0.8f,
             0.999f, 1e-8f,        0.0f, 0.7f,       "wte.*,h.?.ln_1.*"};
  // dp, tp, pp, sp, virtual_stages, pp_layers, zero (LoadConfig does not check them)
  a.parallel = {3, 2, 4, true, 2, "3,1", 1, 25.0f, 1234.5f};
  a.checkpoint = {false, "ck/dir", 7, 2.5, false, false, 5, 100, "skip", "auto", 19, false};
  a.resilience.stop_on_nonfinite = true;
  a.resilience.skip_batches = "40:3";
  a.resilience.spike_z = 4.5;
  a.monitor.peak_gflops = 123.456;
  a.monitor.metrics_jsonl = false;
  a.monitor.metrics_port = 9401;
  a.monitor.metrics_addr = "10.1.2.3";
  a.monitor.metrics_token = "t0k";
  a.monitor.alerts = {false, 9.5, 0.25, 30, 5, 2.5, false, "http://h/x"};

  std::string text = ToToml(a);
  std::string path = WriteConfig("round.toml", text);
  RunConfig b = LoadConfig(path, {});
  a.source = b.source;
  EXPECT_EQ(a, b) << text;
  EXPECT_EQ(ToToml(b).substr(ToToml(b).find('[')), text.substr(text.find('[')));

  // Every key is written, also those at their default.
  std::string defaults = ToToml(RunConfig{});
  for (const char* key :
       {"[model]", "[data]", "[train]", "[optim]", "[parallel]", "[checkpoint]", "[resilience]",
        "[monitor]", "\nn_layer = 0", "\nval = \"\"", "\nmicro_batch_size = 0", "\ndp = 0",
        "\nzero = 0", "\nbucket_mb = 25.0", "\ninit_std = 0.02", "\nstop_on_nonfinite = false",
        "\nsdc_every = 100", "\nseed = 1337"})
    EXPECT_NE(defaults.find(key), std::string::npos) << key << " missing in\n" << defaults;
}

TEST(Config, UnknownKeyNamesFileAndKey) {
  std::string msg = LoadError("unknown_key.toml", "[train]\nstepz = 3\n");
  EXPECT_NE(msg.find("unknown_key.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[train] stepz: unknown key"), std::string::npos) << msg;
  EXPECT_NE(msg.find("steps, batch_size"), std::string::npos) << msg;  // the known keys

  msg = LoadError("nested.toml", "[train.extra]\nx = 1\n");
  EXPECT_NE(msg.find("[train] extra: unknown key"), std::string::npos) << msg;
}

TEST(Config, UnknownSectionNamesFileAndSection) {
  std::string msg = LoadError("unknown_section.toml", "[optimizer]\nlr = 1e-3\n");
  EXPECT_NE(msg.find("unknown_section.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optimizer: unknown section"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model, data, train, optim"), std::string::npos) << msg;

  msg = LoadError("toplevel.toml", "lr = 1e-3\n");
  EXPECT_NE(msg.find("lr: unknown section"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesKeyAndValue) {
  std::string msg = LoadError("type.toml", "[optim]\nlr = \"abc\"\n");
  EXPECT_NE(msg.find("type.toml: [optim] lr: expected a number, got string \"abc\""),
            std::string::npos)
      << msg;
  msg = LoadError("float_for_int.toml", "[train]\nsteps = 1.5\n");
  EXPECT_NE(msg.find("[train] steps: expected an integer, got float 1.5"), std::string::npos)
      << msg;
  msg = LoadError("bool.toml", "[checkpoint]\nsave_final = 1\n");
  EXPECT_NE(msg.find("[checkpoint] save_final: expected true or false"), std::string::npos) << msg;
  msg = LoadError("string.toml", "[model]\nname = 2\n");
  EXPECT_NE(msg.find("[model] name: expected a string, got integer 2"), std::string::npos) << msg;
  msg = LoadError("big.toml", "[train]\nsteps = 99999999999\n");
  EXPECT_NE(msg.find("[train] steps: expected a 32-bit integer"), std::string::npos) << msg;
  msg = LoadError("section_value.toml", "[train]\nx = 1\n", {});
  EXPECT_NE(msg.find("[train] x: unknown key"), std::string::npos) << msg;
}

TEST(Config, EmbdNotDivisibleByHeads) {
  std::string msg = LoadError("heads.toml", "[model]\nn_embd = 100\nn_head = 3\n");
  EXPECT_NE(msg.find("heads.toml: [model] n_embd: expected a multiple of n_head = 3, got 100"),
            std::string::npos)
      << msg;
}

TEST(Config, SeqLenLongerThanBlockSize) {
  std::string msg = LoadError("seq.toml", "[model]\nname = \"gpt2-tiny\"\n[data]\nseq_len = 65\n");
  EXPECT_NE(msg.find("seq.toml: [data] seq_len: 65 is longer than block_size 64"),
            std::string::npos)
      << msg;
}

TEST(Config, PrefetchMustBePositive) {
  std::string msg = LoadError("pf.toml", "[data]\nprefetch = 0\n");
  EXPECT_NE(msg.find("pf.toml: [data] prefetch:"), std::string::npos) << msg;
}

TEST(Config, NonFiniteLearningRate) {
  std::string msg = LoadError("nan.toml", "[optim]\nlr = nan\n");
  EXPECT_NE(msg.find("nan.toml: [optim] lr: expected a finite number > 0, got nan"),
            std::string::npos)
      << msg;
  msg = LoadError("inf.toml", "[optim]\nlr = inf\n");
  EXPECT_NE(msg.find("[optim] lr: expected a finite number > 0, got inf"), std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"optim.lr=-inf"}); });
  EXPECT_NE(msg.find("--set optim.lr: expected a finite number > 0, got -inf"), std::string::npos)
      << msg;
  msg = LoadError("huge.toml", "[optim]\nlr = 1e300\n");
  EXPECT_NE(msg.find("[optim] lr: expected a number within float range"), std::string::npos) << msg;
}

TEST(Config, OutOfRangeValues) {
  std::string msg = LoadError("min_lr.toml", "[optim]\nlr = 1e-3\nmin_lr = 1e-2\n");
  EXPECT_NE(msg.find("[optim] min_lr: expected at most lr = 0.001, got 0.01"), std::string::npos)
      << msg;
  msg = LoadError("beta.toml", "[optim]\nbeta2 = 1.0\n");
  EXPECT_NE(msg.find("[optim] beta2: expected a number in [0, 1), got 1"), std::string::npos)
      << msg;
  msg = LoadError("clip.toml", "[optim]\ngrad_clip = -1\n");
  EXPECT_NE(msg.find("[optim] grad_clip: expected a finite number >= 0, got -1"), std::string::npos)
      << msg;
  msg = LoadError("steps.toml", "[train]\nsteps = 0\n");
  EXPECT_NE(msg.find("[train] steps: expected an integer > 0, got 0"), std::string::npos) << msg;
  msg = LoadError("micro.toml", "[train]\nmicro_batch_size = -2\n");
  EXPECT_NE(msg.find("[train] micro_batch_size: expected an integer >= 0, got -2"),
            std::string::npos)
      << msg;
  msg = LoadError("model_name.toml", "[model]\nname = \"gpt5\"\n");
  EXPECT_NE(msg.find("model_name.toml: [model] name: unknown model \"gpt5\""), std::string::npos)
      << msg;
}

TEST(Config, BadEnumListsAllowedValues) {
  std::string msg = LoadError("enum.toml", "[train]\nprecision = \"fp4\"\n");
  EXPECT_NE(
      msg.find("enum.toml: [train] precision: expected one of bf16, fp32, fp16, fp8; got \"fp4\""),
      std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"model.recompute=some"}); });
  EXPECT_NE(msg.find("--set model.recompute: expected one of none, attn, full"), std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"optim.schedule=step"}); });
  EXPECT_NE(msg.find("--set optim.schedule: expected one of cosine, linear, constant"),
            std::string::npos)
      << msg;
}

TEST(Config, LoraDropoutIsAProbabilityBesideARank) {
  std::string msg = BadInputMessage([] { LoadConfig("", {"lora.rank=4", "lora.dropout=1"}); });
  EXPECT_NE(msg.find("--set lora.dropout: expected a probability in [0, 1), got 1"),
            std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"lora.dropout=0.1"}); });
  EXPECT_NE(msg.find("lora.dropout: drops the adapters' inputs; set [lora] rank too"),
            std::string::npos)
      << msg;
  EXPECT_EQ(LoadConfig("", {"lora.rank=4", "lora.dropout=0.25"}).ResolvedModel().lora_dropout,
            0.25f);
}

TEST(Config, DoraNeedsARank) {
  std::string msg = BadInputMessage([] { LoadConfig("", {"lora.dora=true"}); });
  EXPECT_NE(msg.find("--set lora.dora: rescales the adapted products; set [lora] rank too"),
            std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"lora.rank=4", "lora.dora=yes"}); });
  EXPECT_NE(msg.find("--set lora.dora: expected true or false"), std::string::npos) << msg;
  const model::ModelConfig m = LoadConfig("", {"lora.rank=4", "lora.dora=true"}).ResolvedModel();
  EXPECT_TRUE(m.lora_dora);
  // A shape key: the checkpoint of a DoRA run is not a LoRA run's.
  model::ModelConfig plain = m;
  plain.lora_dora = false;
  const auto d = model::FirstDifference(m, plain);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->key, "lora_dora");
}

TEST(Config, MalformedSetIsRejected) {
  std::string msg = BadInputMessage([] { LoadConfig("", {"optim.lr"}); });
  EXPECT_NE(msg.find("--set optim.lr: expected section.key=value"), std::string::npos) << msg;
  msg = BadInputMessage([] { LoadConfig("", {"lr=1e-3"}); });
  EXPECT_NE(msg.find("--set lr=1e-3: expected section.key=value"), std::string::npos) << msg;
  msg = BadInputMessage([] { LoadConfig("", {"optim.=1"}); });
  EXPECT_NE(msg.find("expected section.key=value"), std::string::npos) << msg;
  msg = BadInputMessage([] { LoadConfig("", {"optim.lrr=1"}); });
  EXPECT_NE(msg.find("--set optim.lrr: unknown key (known: lr, min_lr"), std::string::npos) << msg;
  msg = BadInputMessage([] { LoadConfig("", {"optimizer.lr=1"}); });
  EXPECT_NE(msg.find("--set optimizer.lr: unknown section \"optimizer\""), std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"optim.lr=abc"}); });
  EXPECT_NE(msg.find("--set optim.lr: expected a number, got string \"abc\""), std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"train.steps=1\nother = 2"}); });
  EXPECT_NE(msg.find("--set train.steps: expected an integer"), std::string::npos) << msg;
}

TEST(Config, MissingFileIsNamed) {
  std::string msg = BadInputMessage([] { LoadConfig("no/such/run.toml", {}); });
  EXPECT_NE(msg.find("config no/such/run.toml: no such file"), std::string::npos) << msg;
}

TEST(Config, SyntaxErrorGivesLineAndColumn) {
  std::string msg = LoadError("syntax.toml", "[train]\nsteps = 3\nname = \"unterminated\n");
  EXPECT_NE(msg.find("syntax.toml:3:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid TOML"), std::string::npos) << msg;
}

TEST(Config, ValidateBatchNamesRanksAndMicroBatch) {
  RunConfig cfg;
  cfg.source = "a.toml";
  cfg.train.batch_size = 10;
  cfg.train.micro_batch_size = 4;
  std::string msg = BadInputMessage([&] { ResolveLayout(cfg, 2); });
  EXPECT_NE(msg.find("config a.toml: [train] batch_size: 10 is not divisible by ranks (2) × "
                     "micro_batch_size (4)"),
            std::string::npos)
      << msg;
  cfg.train.micro_batch_size = 0;
  msg = BadInputMessage([&] { ResolveLayout(cfg, 4); });
  EXPECT_NE(msg.find("10 is not divisible by ranks (4)"), std::string::npos) << msg;
  EXPECT_NO_THROW(ResolveLayout(cfg, 5));
  cfg.train.micro_batch_size = 5;
  EXPECT_NO_THROW(ResolveLayout(cfg, 2));
}

// [parallel] dp, tp, pp, zero: read, written back, unknown keys still refused.
TEST(Config, ParallelLayoutKeysParseAndRoundTrip) {
  RunConfig a = LoadConfig("", {"parallel.dp=2", "parallel.zero=3"});
  EXPECT_EQ(a.parallel.dp, 2);
  EXPECT_EQ(a.parallel.tp, 1);
  EXPECT_EQ(a.parallel.pp, 1);
  EXPECT_EQ(a.parallel.zero, 3);
  EXPECT_EQ(RunConfig{}.parallel.dp, 0);  // 0 = the ranks launched / (tp x pp)
  std::string text = ToToml(a);
  EXPECT_NE(text.find("[parallel]\ndp = 2\ntp = 1\npp = 1\nsp = false\nvirtual_stages = "
                      "1\npp_layers = \"\"\nzero = 3\n"),
            std::string::npos)
      << text;
  RunConfig b = LoadConfig(WriteConfig("parallel_round.toml", text), {});
  a.source = b.source;
  EXPECT_EQ(a, b) << text;
  std::string msg = BadInputMessage([] { LoadConfig("", {"parallel.zeros=1"}); });
  EXPECT_NE(msg.find("--set parallel.zeros: unknown key (known: dp, tp, pp, sp, virtual_stages, "
                     "pp_layers, zero,"),
            std::string::npos)
      << msg;
  msg = LoadError("parallel_type.toml", "[parallel]\ntp = 2.5\n");
  EXPECT_NE(msg.find("[parallel] tp: expected an integer, got float 2.5"), std::string::npos)
      << msg;
}

TEST(Config, ShippedConfigsLoad) {
#ifdef KEEL_SOURCE_DIR
  const std::string dir = std::string(KEEL_SOURCE_DIR) + "/configs/";
  RunConfig quick = LoadConfig(dir + "quickstart.toml", {});
  EXPECT_EQ(quick.model.name, "gpt2-mini");
  EXPECT_EQ(quick.data.seq_len, 128);
  EXPECT_EQ(quick.train.steps, 300);
  EXPECT_EQ(quick.optim.lr, 1e-3f);
  RunConfig tiny = LoadConfig(dir + "test-tiny.toml", {});
  EXPECT_EQ(tiny.model.name, "gpt2-tiny");
  EXPECT_EQ(tiny.train.precision, "fp32");
  EXPECT_EQ(tiny.train.sample_count, 0);
#else
  FAIL() << "KEEL_SOURCE_DIR is not defined: build the tests with CMake";
#endif
}

// [[data.sources]]: the blend form of [data] train. Parsed with defaults, written back by ToToml
// to an equal config, and every malformed entry named by its index and key.
TEST(Config, DataSourcesParseAndRoundTrip) {
  std::string path = WriteConfig("sources.toml",
                                 "[data]\nseq_len = 16\n\n[[data.sources]]\npath = \"a.u16\"\n"
                                 "weight = 0.7\n\n[[data.sources]]\npath = \"b.u16\"\n");
  RunConfig a = LoadConfig(path, {});
  ASSERT_EQ(a.data.sources.size(), 2u);
  EXPECT_EQ(a.data.sources[0], (DataSource{"a.u16", 0.7}));
  EXPECT_EQ(a.data.sources[1], (DataSource{"b.u16", 1.0}));  // weight defaults to 1
  EXPECT_EQ(a.data.train, "");

  std::string text = ToToml(a);
  RunConfig b = LoadConfig(WriteConfig("sources_round.toml", text), {});
  a.source = b.source;
  EXPECT_EQ(a, b) << text;
  EXPECT_NE(text.find("[[data.sources]]\npath = \"a.u16\"\nweight = 0.7\n"), std::string::npos)
      << text;
  // No sources: nothing written, so the single-dataset file reads as before.
  EXPECT_EQ(ToToml(RunConfig{}).find("sources"), std::string::npos);
}

TEST(Config, DataSourcesBadInputNamesTheEntry) {
  const std::string two = "[[data.sources]]\npath = \"a\"\n[[data.sources]]\n";
  std::string msg = LoadError("src_nopath.toml", two + "weight = 2\n");
  EXPECT_NE(msg.find("src_nopath.toml: [data] sources[1].path: expected a string"),
            std::string::npos)
      << msg;
  msg = LoadError("src_numpath.toml", two + "path = 3\n");
  EXPECT_NE(msg.find("[data] sources[1].path: expected a string, got integer 3"), std::string::npos)
      << msg;
  msg = LoadError("src_zero.toml", two + "path = \"b\"\nweight = 0\n");
  EXPECT_NE(msg.find("[data] sources[1].weight: expected a finite number > 0, got 0"),
            std::string::npos)
      << msg;
  msg = LoadError("src_neg.toml", "[[data.sources]]\npath = \"a\"\nweight = -1.5\n");
  EXPECT_NE(msg.find("[data] sources[0].weight: expected a finite number > 0"), std::string::npos)
      << msg;
  msg = LoadError("src_unknown.toml", two + "path = \"b\"\nwieght = 1\n");
  EXPECT_NE(msg.find("[data] sources[1].wieght: unknown key (known: path, weight)"),
            std::string::npos)
      << msg;
  msg = LoadError("src_empty.toml", "[data]\nsources = []\n");
  EXPECT_NE(msg.find("src_empty.toml: [data] sources: expected at least one source"),
            std::string::npos)
      << msg;
  msg = LoadError("src_string.toml", "[data]\nsources = \"a.u16\"\n");
  EXPECT_NE(msg.find("[data] sources: expected an array of tables"), std::string::npos) << msg;
  msg = LoadError("src_both.toml", "[data]\ntrain = \"t\"\n[[data.sources]]\npath = \"a\"\n");
  EXPECT_NE(msg.find("src_both.toml: [data] sources: set either [data] train or [[data.sources]]"),
            std::string::npos)
      << msg;
  msg = LoadError("src_emptypath.toml", "[[data.sources]]\npath = \"\"\n");
  EXPECT_NE(msg.find("[data] sources[0].path: expected a non-empty string"), std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"data.sources=x"}); });
  EXPECT_NE(msg.find("--set data.sources: the sources cannot be set with --set"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace keel::train

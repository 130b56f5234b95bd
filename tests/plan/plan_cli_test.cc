// `keel plan` end to end: the table, --json, --explain, TOML input and one-line bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "train/run_util.h"

namespace {

// `keel ARGS` with stderr folded into stdout, as a user sees it.
using Result = keel::test::RunResult;

Result Keel(const std::string& args) {
  const std::string cmd = std::string(KEEL_BINARY) + " " + args;
  return keel::test::RunCommand("{ { " + cmd + "; } 2>&1; }");
}

TEST(PlanCli, RanksLayoutsInATable) {
  Result r = Keel("plan --model 175B --accelerators 64 --global-batch 512 --top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
  EXPECT_NE(r.out.find("layouts fit"), std::string::npos);
}

TEST(PlanCli, JsonIsParseableAndBestFirst) {
  Result r = Keel("plan --model 7B --accelerators 64 --zero 3 --json --top 2");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_GE(j["layouts"].size(), 2u);
  EXPECT_TRUE(j["layouts"][0]["fits"].get<bool>());
  EXPECT_EQ(j["layouts"][0]["zero"], 3);
  EXPECT_GE(j["layouts"][0]["tokens_per_s"].get<double>(),
            j["layouts"][1]["tokens_per_s"].get<double>());
}

TEST(PlanCli, ExplainNamesTheActivationRow) {
  Result r = Keel(
      "plan --model 175B --accelerators 64 --tp 8 --pp 8 --dp 1 --micro-batch 1 "
      "--recompute selective --sp on --explain");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tp+sp+selective: sbh(34/t)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble"), std::string::npos);
  // The groups and collectives keel train runs for this layout (model/transformer.cc,
  // train/step.cc).
  EXPECT_NE(r.out.find("tp    8 ranks each (same dp, pp; neighbours): per block one "
                       "reduce-scatter"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("sequence parallel: each rank keeps 1/8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pp    8 stages each"), std::string::npos) << r.out;
}

TEST(PlanCli, ReadsTomlAndFlagsWin) {
  const auto path = std::filesystem::temp_directory_path() / "keel_plan_test.toml";
  std::ofstream(path) << "[model]\nmodel = \"7B\"\n[cluster]\naccelerators = 16\n"
                         "accelerator = \"A100-80GB\"\nglobal_batch = 64\n"
                         "[run]\nprice_per_hour = 3.5\nnode_mtbf_hours = 1000\n";
  Result r = Keel("plan --config " + path.string() + " --accelerators 32 --json --top 1");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["accelerators"], 32);
  EXPECT_EQ(j["accelerator"], "A100-80GB");
  EXPECT_EQ(j["global_batch"], 64);
  EXPECT_EQ(j["price_per_hour"], 3.5);
  EXPECT_EQ(j["node_mtbf_hours"], 1000);
  std::ofstream(path) << "modle = \"7B\"\n";
  r = Keel("plan --config " + path.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("unknown key \"modle\""), std::string::npos) << r.out;
}

TEST(PlanCli, InvalidRequestsAreOneLineAndExitTwo) {
  const char* cases[][2] = {
      {"--model 7B --accelerators 64 --tp 3", "heads 32 % tp 3 = 2"},
      {"--model 7B --accelerators 64 --pp 5", "layers 32 % pp 5 = 2"},
      {"--model 7B --accelerators 64 --tp 8 --pp 2 --dp 2", "world 64 != tp 8 x pp 2 x dp 2 = 32"},
      {"--model 7B --accelerators 64 --global-batch 100 --dp 64",
       "global batch 100 is not divisible by dp 64"},
      {"--model 9B", "unknown model \"9B\""},
      {"--model 7B --tp 0", "--tp 0: expected >= 1"},
      {"--model 7B --zero 4", "--zero 4: expected 0, 1, 2 or 3"},
      {"--model 7B --node-mtbf-hours 0", "--node-mtbf-hours 0: expected > 0"},
      {"--model 7B --price-per-hour -2", "--price-per-hour -2: expected >= 0"},
  };
  for (const auto& c : cases) {
    Result r = Keel(std::string("plan ") + c[0]);
    EXPECT_EQ(r.code, 2) << c[0] << "\n" << r.out;
    EXPECT_NE(r.out.find(c[1]), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "not one line: " << r.out;
  }
}

TEST(PlanCli, CheckpointsAndCostInTableJsonAndExplain) {
  const std::string run = "plan --model 7B --accelerators 64 --price-per-hour 2 --tokens 1e12 ";
  Result r = Keel(run + "--top 3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("save every"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("goodput"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("at $2/h"), std::string::npos) << r.out;
  r = Keel(run + "--json --top 1");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  const auto& cost = j["layouts"][0]["cost"];
  EXPECT_EQ(cost["tokens"].get<double>(), 1e12);
  EXPECT_NEAR(cost["money"].get<double>(), 2 * cost["accel_hours"].get<double>(), 1e-6);
  const double g = j["checkpoint"]["goodput"].get<double>();
  EXPECT_GT(g, 0.5);
  EXPECT_LT(g, 1.0);
  r = Keel(run + "--tp 1 --pp 1 --zero 3 --micro-batch 1 --recompute full --sp off --explain");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sqrt(2dM)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("accel-h"), std::string::npos) << r.out;
}

// The smaller optimizer-state tiers: the header's bytes per parameter, the JSON's state, and the
// refusals (no master needs bf16 and no LoRA; the dtype is fp32 or bf16).
TEST(PlanCli, StateTiersShrinkTheBytesPerParameter) {
  for (auto [flags, bpp] : {std::pair<const char*, const char*>{"", "18 bytes/param"},
                            {"--state-dtype bf16", "14 bytes/param"},
                            {"--no-master", "14 bytes/param"},
                            {"--state-dtype bf16 --grad-dtype bf16", "12 bytes/param"},
                            {"--state-dtype bf16 --no-master", "10 bytes/param"}}) {
    Result r = Keel(std::string("plan --model gpt2 --accelerators 1 --accounting keel ") + flags);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(bpp), std::string::npos) << flags << ": " << r.out;
  }
  Result j = Keel(
      "plan --model gpt2 --accelerators 1 --accounting keel --state-dtype bf16 "
      "--no-master --grad-dtype bf16 --zero 0 --json --top 1");
  ASSERT_EQ(j.code, 0) << j.out;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["state_dtype"], "bf16");
  EXPECT_EQ(doc["master_weights"], false);
  EXPECT_EQ(doc["grad_dtype"], "bf16");
  for (auto [flags, want] :
       {std::pair<const char*, const char*>{"--precision fp32 --no-master", "--no-master"},
        {"--no-master --lora-rank 8", "--no-master"},
        {"--state-dtype fp8", "--state-dtype"},
        {"--grad-dtype fp8", "--grad-dtype"},
        {"--precision fp32 --grad-dtype bf16", "--grad-dtype"},
        {"--grad-dtype bf16 --lora-rank 8", "--grad-dtype"}}) {
    Result r = Keel(std::string("plan --model gpt2 --accelerators 1 ") + flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  }
}

// The two offload tiers move the master and moments out of the accelerator's memory and charge
// the step their traffic: a disk's reads and writes of the whole state, shared by the node's
// ranks; the host tier's gradient and weight copies, each rank's own link (--host-gbps).
TEST(PlanCli, OffloadTiersPriceTheirTraffic) {
  const std::string base =
      "plan --model gpt2 --accelerators 8 --per-node 8 --global-batch 64 --accounting keel "
      "--zero 1 --micro-batch 2 --tp 1 --pp 1 --json --top 1 --host-gbps 40 ";
  auto layout = [](const Result& r) { return nlohmann::json::parse(r.out)["layouts"][0]; };
  const Result mem = Keel(base), disk = Keel(base + "--offload"),
               host = Keel(base + "--offload-host");
  for (const Result* r : {&mem, &disk, &host}) ASSERT_EQ(r->code, 0) << r->out;
  const auto m = layout(mem), d = layout(disk), h = layout(host);
  for (const auto* x : {&d, &h}) {
    EXPECT_EQ((*x)["memory_bytes"]["master"], 0.0);
    EXPECT_EQ((*x)["memory_bytes"]["moments"], 0.0);
    EXPECT_GE(double((*x)["memory_bytes"]["offload_tier"]),
              double(m["memory_bytes"]["master"]) + double(m["memory_bytes"]["moments"]));
  }
  EXPECT_GT(double(d["memory_bytes"]["offload_buffers"]), 0.0);
  EXPECT_EQ(double(h["memory_bytes"]["offload_buffers"]), 0.0);      // the staging is host memory
  const double held = double(m["memory_bytes"]["master"]) / 4;       // ZeRO 1's shard
  EXPECT_NEAR(double(h["offload_s"]), held * (4 + 2) / 40e9, 1e-9);  // grads down, bf16 up
  EXPECT_NEAR(double(d["offload_s"]), 2 * double(d["memory_bytes"]["offload_tier"]) * 8 / 2e9,
              1e-9);
  EXPECT_EQ(nlohmann::json::parse(host.out)["offload"]["host"], true);
  for (auto [flags, want] :
       {std::pair<const char*, const char*>{"--offload --offload-host", "two tiers"},
        {"--offload-host --precision fp32", "--offload-host"}}) {
    Result r = Keel(std::string("plan --model gpt2 --accelerators 1 ") + flags);
    EXPECT_EQ(r.code, 2) << flags << ": " << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  }
}

TEST(PlanCli, HelpShowsExamples) {
  Result r = Keel("help plan");
  ASSERT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Examples:"), std::string::npos);
}

}  // namespace

// The trainer's pre-allocation check (train/memory_check.h) sizes a rank's state and activations
// by the formulas its buffers are allocated with: the same figure `keel plan --accounting keel`
// gives for the job (trainer_bytes_test.cc holds that figure to the allocations), and a Llama's
// untied lm_head counts, which the GPT-2-only parameter count it replaced left out.
#include "keel/train/memory_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "bad_input.h"
#include "keel/model/activations.h"
#include "keel/model/params.h"
#include "keel/plan/memory.h"

namespace keel::train {
namespace {

using Items = std::vector<std::pair<std::string, double>>;

// The layout the trainer resolves for `cfg` on `dims`, with these micro-batches and stages.
parallel::Layout LayoutOf(const RunConfig& cfg, const parallel::ParallelDims& dims, int micro,
                          int n_micro, std::vector<int> stage_layers = {}) {
  parallel::Layout l;
  static_cast<parallel::ParallelDims&>(l) = dims;
  l.sp = cfg.parallel.sp;
  l.virtual_stages = cfg.parallel.virtual_stages;
  l.stage_layers = std::move(stage_layers);
  l.micro_batch = micro;
  l.n_micro = n_micro;
  return l;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The items of the model's state: weights, gradients, master, moments and ZeRO's buffers.
double StateOf(const Items& items) {
  double b = 0;
  for (const auto& [what, bytes] : items)
    if (StartsWith(what, "the weights, gradients and fp32 master copy") ||
        what == "the AdamW moments" || StartsWith(what, "ZeRO-"))
      b += bytes;
  return b;
}

double ActivationsOf(const Items& items) {
  for (const auto& [what, bytes] : items)
    if (StartsWith(what, "the activations of micro-batches")) return bytes;
  ADD_FAILURE() << "no activations item";
  return 0;
}

double TotalOf(const Items& items) {
  double t = 0;
  for (const auto& [what, bytes] : items) t += bytes;
  return t;
}

// The state bytes of the formula the check used before: GPT-2's parameter count (wte, wpe, blocks
// of 12·C² + 13·C, ln_f) for any family, times 2 (bf16 weights) + 4 (gradients) + 4 (master) + 8
// (moments) bytes at ZeRO 0.
double OldGpt2OnlyStateBytes(const model::ModelConfig& m) {
  const double C = m.n_embd, L = m.n_layer, V = m.padded_vocab();
  const double params = V * C + double(m.block_size) * C + L * (12 * C * C + 13 * C) + 2 * C;
  return 18 * params;
}

// A Llama whose blocks are as large as GPT-2's (n_kv_head = n_head: attention 4·C², SwiGLU's
// 3·C·F with F = 8·C/3 = 8·C²): the untied lm_head (V x C) is what the GPT-2 count misses.
RunConfig LlamaConfig() {
  RunConfig cfg;  // bf16
  cfg.model.name = "llama-120m";
  cfg.model.n_kv_head = 12;
  cfg.data.seq_len = 256;
  return cfg;
}

TEST(MemoryCheck, CountsALlamasUntiedLmHead) {
  RunConfig cfg = LlamaConfig();
  // The training-time figure alone (the end's gather is the next test's).
  cfg.checkpoint.save_final = false;
  cfg.train.sample_count = 0;
  const model::ModelConfig m = cfg.ResolvedModel();
  ASSERT_TRUE(m.llama());
  ASSERT_EQ(3 * m.n_embd * m.ffn(), 8 * m.n_embd * m.n_embd);
  const parallel::ParallelDims dims{1, 1, 1, 0};
  const Items items = RunMemoryItems(cfg, LayoutOf(cfg, dims, 1, 8));
  const double state = StateOf(items);

  // The state the check uses is StateBytesPerRank over the model's layout, lm_head included.
  const model::ParamLayout layout = model::ParamLayout::Whole(m);
  ASSERT_EQ(layout.Find("lm_head.weight").numel, size_t(m.padded_vocab()) * m.n_embd);
  EXPECT_EQ(
      state,
      double(parallel::StateBytesPerRank(model::StateShapeOf(layout, DType::kBF16), dims).total()));
  // More than the GPT-2-only count by about the lm_head's V·C parameters x 18 bytes (less GPT-2's
  // position table and biases, which a Llama does not have).
  const double old_state = OldGpt2OnlyStateBytes(m);
  const double lm_head = 18.0 * m.padded_vocab() * m.n_embd;
  EXPECT_GT(state - old_state, 0.95 * lm_head);
  EXPECT_LT(state - old_state, lm_head);

  // A machine between the two figures: the old count let the run start, the check refuses it.
  const double total = TotalOf(items), old_total = total - state + old_state;
  const double between = (total + old_total) / 2;
  ASSERT_LT(old_total, between);
  EXPECT_NO_THROW(CheckMemoryFits(cfg, LayoutOf(cfg, dims, 1, 8), total));
  const std::string msg =
      BadInputMessage([&] { CheckMemoryFits(cfg, LayoutOf(cfg, dims, 1, 8), between); });
  EXPECT_NE(msg.find("this run needs "), std::string::npos) << msg;
  EXPECT_NE(msg.find(" per rank, "), std::string::npos) << msg;
  // The checkpoint's staging (master and moments in fp32, 12 bytes a parameter at dp 1) and the
  // state: the two largest.
  EXPECT_NE(msg.find("the largest items are the checkpoint's staging copy"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("and the weights, gradients and fp32 master copy of "
                     "1.622e+08 parameters (model.n_layer 12, n_embd 768)"),
            std::string::npos)
      << msg;
}

// The check's state and activations equal the planner's (`keel plan --accounting keel`) for the
// same job and layout: GPT-2 and a Llama, bf16 and fp32, across ZeRO stages, tensor parallelism
// (with sequence parallelism), pipeline stages (interleaved too) and recompute.
TEST(MemoryCheck, EqualsThePlannersFigureForTheSameLayout) {
  struct Case {
    const char* model;
    const char* precision;
    const char* recompute;
    int dp, tp, pp, zero, v;
    bool sp;
  };
  const Case cases[] = {
      {"gpt2-mini", "bf16", "none", 1, 1, 1, 0, 1, false},
      {"gpt2-mini", "fp32", "attn", 2, 1, 1, 1, 1, false},
      {"gpt2-mini", "bf16", "full", 4, 1, 1, 3, 1, false},
      {"gpt2-mini", "bf16", "none", 1, 2, 1, 0, 1, true},
      {"gpt2-mini", "bf16", "none", 1, 1, 2, 0, 1, false},
      {"gpt2-mini", "fp32", "none", 2, 1, 2, 1, 2, false},
      {"llama-mini", "bf16", "none", 1, 1, 1, 0, 1, false},
      {"llama-mini", "fp32", "attn", 2, 1, 1, 2, 1, false},
      {"llama-mini", "bf16", "none", 2, 1, 1, 3, 1, false},
      {"llama-mini", "bf16", "attn", 1, 2, 1, 0, 1, false},
      {"llama-mini", "bf16", "none", 2, 2, 2, 1, 1, true},
      {"llama-mini", "bf16", "full", 1, 1, 4, 0, 1, false},
      {"llama-mini", "bf16", "none", 1, 1, 2, 0, 2, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " " + c.precision + " " + c.recompute + " dp " +
                 std::to_string(c.dp) + " tp " + std::to_string(c.tp) + " pp " +
                 std::to_string(c.pp) + " zero " + std::to_string(c.zero) + " v " +
                 std::to_string(c.v) + (c.sp ? " sp" : ""));
    const int micro = 2, n_micro = 4;
    RunConfig cfg;
    cfg.model.name = c.model;
    cfg.model.recompute = c.recompute;
    cfg.train.precision = c.precision;
    // The planner's model is as long as its sequences (ModelSpec::seq is also GPT-2's block_size,
    // the rows of wpe): the run's full context, 256 for both models.
    cfg.data.seq_len = 256;
    cfg.parallel.virtual_stages = c.v;
    cfg.parallel.sp = c.sp;
    const parallel::ParallelDims dims{c.dp, c.tp, c.pp, c.zero};
    const Items items = RunMemoryItems(cfg, LayoutOf(cfg, dims, micro, n_micro));

    plan::Job job;
    job.model = plan::SpecOf(c.model, cfg.ResolvedModel(), cfg.data.seq_len);
    job.precision =
        std::string(c.precision) == "fp32" ? plan::Precision::kFp32 : plan::Precision::kBf16;
    job.accounting = plan::Accounting::kKeel;
    job.global_batch = micro * n_micro * c.dp;
    job.cluster.world = dims.world();
    job.cluster.per_node = 1;
    job.cluster.accel = plan::NamedAccelerator("H100-80GB");
    plan::Layout l;
    static_cast<parallel::ParallelDims&>(l) = dims;
    l.micro_batch = micro;
    l.recompute = std::string(c.recompute) == "none"   ? plan::Recompute::kNone
                  : std::string(c.recompute) == "attn" ? plan::Recompute::kSelective
                                                       : plan::Recompute::kFull;
    l.sp = c.sp;
    l.virtual_stages = c.v;
    const plan::MemoryBreakdown plan = plan::EstimateMemory(job, l);
    ASSERT_TRUE(plan.exact_activations);
    EXPECT_EQ(StateOf(items) + ActivationsOf(items), plan.used());
    EXPECT_EQ(StateOf(items), plan.state.total() + plan.comm_buffers);
  }
}

// Uneven pipeline stages ([parallel] pp_layers) are sized as the trainer builds them: the busiest
// stage holds 3 of the 4 blocks, more than either stage of an equal split.
TEST(MemoryCheck, SizesTheBusiestOfUnevenStages) {
  RunConfig cfg;
  cfg.model.name = "llama-mini";  // 4 layers
  cfg.data.seq_len = 128;
  const parallel::ParallelDims dims{1, 1, 2, 0};
  const double equal = StateOf(RunMemoryItems(cfg, LayoutOf(cfg, dims, 1, 4)));
  cfg.parallel.pp_layers = "3,1";
  const double uneven = StateOf(RunMemoryItems(cfg, LayoutOf(cfg, dims, 1, 4, {3, 1})));
  const model::ModelConfig m = cfg.ResolvedModel();
  const model::ParamLayout first = model::ParamLayout::Stage(m, model::StageOf(m, {3, 1}, 0));
  EXPECT_EQ(
      uneven,
      double(parallel::StateBytesPerRank(model::StateShapeOf(first, DType::kBF16), dims).total()));
  EXPECT_GT(uneven, equal);
}

// A width keel's int shapes cannot hold is refused with the dimension, before any layout.
TEST(MemoryCheck, RefusesAWidthPastTheShapesRange) {
  RunConfig cfg;
  cfg.model.name = "gpt2-mini";
  cfg.model.n_embd = 1 << 30;
  const std::string msg = BadInputMessage([&] {
    RunMemoryItems(cfg, LayoutOf(cfg, {1, 1, 1, 0}, 1, 1));
  });
  EXPECT_NE(msg.find("the weights, gradients and fp32 master copy would hold a tensor 4294967296 "
                     "wide, over keel's limit of 2147483647"),
            std::string::npos)
      << msg;
}

// The per-rank figure a run is checked against memory with: the state shrinks with ZeRO and tp,
// the largest item is named, and a run that fits passes.
TEST(MemoryCheck, NamesTheLargestItemsAndShrinksWithSharding) {
  RunConfig cfg;  // bf16
  cfg.model.name = "gpt2";
  auto layout = [&](const parallel::ParallelDims& d) { return LayoutOf(cfg, d, 1, 8); };
  // The initial weights are whole on every rank whatever the layout (counted, not sharded).
  const std::string init = "the initial weights, whole in fp32 while the state is set from them";
  auto total = [&](const parallel::ParallelDims& d) {
    double t = 0, initial = 0;
    for (const auto& [what, bytes] : RunMemoryItems(cfg, layout(d))) {
      t += bytes;
      if (what == init) initial = bytes;
    }
    EXPECT_EQ(initial, 4.0 * 124475904);  // gpt2's parameters, the padded vocabulary's included
    return t - initial;
  };
  const double one = total({1, 1, 1, 0});
  EXPECT_GT(one, 124e6 * 16);  // 124M parameters x (2 + 4 + 4 + 8) bytes, and activations
  EXPECT_LT(total({4, 1, 1, 3}), 0.5 * one);
  EXPECT_LT(total({1, 2, 1, 0}), 0.7 * one);
  EXPECT_NO_THROW(CheckMemoryFits(cfg, layout({1, 1, 1, 0}), 64e9));
  const std::string msg = BadInputMessage([&] { CheckMemoryFits(cfg, layout({1, 1, 1, 0}), 1e9); });
  EXPECT_NE(msg.find("per rank, 0.9 GiB is available: the largest items are the checkpoint's "
                     "staging copy of this rank's part of the master and moments in fp32 "
                     "(model.n_layer 12, n_embd 768; [checkpoint] saves set it) (1.4 GiB) and "
                     "the weights, gradients and fp32 master copy of 1.245e+08 parameters"),
            std::string::npos)
      << msg;
}

// The checkpoint writer's staging, touched at the start when the run saves at all: the rank's part
// of the master and moments in fp32, and a DiLoCo replica's own state whole (four 124M replicas
// on a 24 GiB host were OOM-killed by it while the check passed).
TEST(MemoryCheck, CountsTheCheckpointStagingAndDilocosOwnState) {
  RunConfig cfg;  // bf16, saves every 30 minutes and at the end
  cfg.model.name = "gpt2";
  cfg.data.seq_len = 256;
  auto staging = [&] {
    for (const auto& [what, bytes] : RunMemoryItems(cfg, LayoutOf(cfg, {4, 1, 1, 0}, 1, 1)))
      if (what.rfind("the checkpoint's staging copy", 0) == 0) return bytes;
    return 0.0;
  };
  const model::ModelConfig m = cfg.ResolvedModel();
  const double n = double(model::StateShapeOf(m, {model::WholeModel(m)}, {}, DType::kBF16).total);
  const double part = std::ceil(n / 4);
  EXPECT_EQ(staging(), 4 * 3 * part);
  cfg.parallel.dp_sync = "diloco";
  cfg.diloco.inner_steps = 4;
  cfg.parallel.grad_comm = "int8";
  // Its master, moments, outer momentum and int8 residual, whole.
  EXPECT_EQ(staging(), 4 * (3 * part + 5 * n));
  cfg.checkpoint.every_minutes = 0;
  cfg.checkpoint.at_end = false;
  cfg.checkpoint.on_signal = false;
  EXPECT_EQ(staging(), 0);
}

// The end of a run gathers the whole model in fp32 on every rank (the model file, the samples): a
// LoRA run over an 8B base trains in about 10 GiB with an int8 base (12 GiB at its start, which
// sets the base a tensor at a time through the largest one's fp32 copy) but needs 30 GiB more
// there. Refused at the start, naming the keys that drop the gather; without them it fits.
TEST(MemoryCheck, TheEndsWholeModelGatherMustFitToo) {
  RunConfig cfg;  // bf16
  cfg.model.name = "llama3-8b";
  cfg.data.seq_len = 128;
  cfg.lora.rank = 16;
  cfg.lora.targets = "all";
  cfg.lora.base = "int8";
  const parallel::Layout layout = LayoutOf(cfg, {1, 1, 1, 0}, 1, 1);
  const auto items = RunMemoryItems(cfg, layout);
  const double trains = TotalOf(items);
  EXPECT_LT(trains, 14e9);
  // The 128,256 x 4,096 embedding (or lm_head) in fp32: an 8B int8 run was OOM-killed without it.
  double largest = 0;
  for (const auto& [what, bytes] : items)
    if (what.find("the largest tensor in fp32") != std::string::npos) largest = bytes;
  EXPECT_EQ(largest, 4.0 * 128256 * 4096);
  const double available = trains + 8e9;  // plenty while it trains, not the 32 GB of the end
  const std::string msg = BadInputMessage([&] { CheckMemoryFits(cfg, layout, available); });
  EXPECT_NE(msg.find("more at its end, where each rank gathers the whole model in fp32"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("set checkpoint.save_final = false and train.sample_count = 0"),
            std::string::npos)
      << msg;
  cfg.checkpoint.save_final = false;
  cfg.train.sample_count = 0;
  EXPECT_NO_THROW(CheckMemoryFits(cfg, layout, available));
}

}  // namespace
}  // namespace keel::train

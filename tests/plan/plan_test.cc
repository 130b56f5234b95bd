// The planner against published numbers: the 16-byte accounting, the ZeRO paper's Figure 1,
// Korthikanti et al. 2022's activation formulas, and keel's own allocations.
#include <gtest/gtest.h>

#include "keel/core/error.h"
#include "keel/model/activations.h"
#include "keel/model/params.h"
#include "keel/model/quantize.h"
#include "keel/plan/comm_time.h"
#include "keel/plan/memory.h"
#include "keel/plan/search.h"

namespace keel::plan {
namespace {

constexpr double GB = 1e9;

TEST(StateBytes, SevenBillionIsSixteenBytesPerParamAnd112GB) {
  const BytesPerParam bpp = StateBytesPerParam(Precision::kBf16, Accounting::kPaper);
  EXPECT_EQ(bpp.total(), 16);
  EXPECT_EQ(ModelStateBytes(7e9, bpp, 0, 1).total(), 112 * GB);
  EXPECT_EQ(ModelStateBytes(7e9, bpp, 3, 64).total(), 1.75 * GB);
}

TEST(StateBytes, KeelKeepsFp32GradsEighteenBytesPerParam) {
  EXPECT_EQ(StateBytesPerParam(Precision::kBf16, Accounting::kKeel).total(), 18);
  EXPECT_EQ(StateBytesPerParam(Precision::kBf16, Accounting::kKeel).grads, 4);
  EXPECT_EQ(StateBytesPerParam(Precision::kFp32, Accounting::kPaper).total(), 16);
  // optim.grad_dtype = "bf16" with bf16 moments: Megatron's and DeepSeek-V3's 12.
  EXPECT_EQ(StateBytesPerParam(Precision::kBf16, Accounting::kKeel, true, true, true).total(), 12);
}

TEST(StateBytes, ZeroPaperFigureOne) {
  // Rajbhandari et al. 2020, Fig. 1: Ψ = 7.5B, Nd = 64, K = 12.
  const double psi = 7.5e9, K = 12, nd = 64;
  const BytesPerParam bpp = StateBytesPerParam(Precision::kBf16, Accounting::kPaper);
  ASSERT_EQ(bpp.master + bpp.moments, K);
  EXPECT_EQ(ModelStateBytes(psi, bpp, 0, 64).total(), (2 + 2 + K) * psi);
  EXPECT_EQ(ModelStateBytes(psi, bpp, 0, 64).total(), 120 * GB);
  EXPECT_DOUBLE_EQ(ModelStateBytes(psi, bpp, 1, 64).total(), 2 * psi + 2 * psi + K * psi / nd);
  EXPECT_NEAR(ModelStateBytes(psi, bpp, 1, 64).total(), 31.4 * GB, 0.01 * GB);
  EXPECT_DOUBLE_EQ(ModelStateBytes(psi, bpp, 2, 64).total(), 2 * psi + (2 + K) * psi / nd);
  EXPECT_NEAR(ModelStateBytes(psi, bpp, 2, 64).total(), 16.6 * GB, 0.05 * GB);
  EXPECT_DOUBLE_EQ(ModelStateBytes(psi, bpp, 3, 64).total(), (2 + 2 + K) * psi / nd);
  EXPECT_EQ(ModelStateBytes(psi, bpp, 3, 64).total(), 1.875 * GB);
}

struct Korthikanti {
  const char* name;
  double h, a, L;
};
// Korthikanti et al. 2022, Table 3; all with t = 8, s = 2048, b = 1.
const Korthikanti kConfigs[] = {{"22B", 6144, 64, 48},
                                {"175B", 12288, 96, 96},
                                {"530B", 20480, 128, 105},
                                {"1T", 25600, 160, 128}};

TEST(Activations, EveryRowMatchesKorthikantiTableTwo) {
  const double s = 2048, b = 1;
  const int t = 8;
  for (const auto& c : kConfigs) {
    SCOPED_TRACE(c.name);
    const double sbh = s * b * c.h, h = c.h, a = c.a;
    const auto kN = Recompute::kNone, kS = Recompute::kSelective, kF = Recompute::kFull;
    EXPECT_DOUBLE_EQ(LayerActivationBytes(s, b, h, a, 1, false, kN), sbh * (34 + 5 * a * s / h));
    EXPECT_DOUBLE_EQ(LayerActivationBytes(s, b, h, a, t, false, kN),
                     sbh * (10 + 24.0 / t + 5 * a * s / (h * t)));
    EXPECT_DOUBLE_EQ(LayerActivationBytes(s, b, h, a, t, true, kN),
                     sbh * (34.0 / t + 5 * a * s / (h * t)));
    EXPECT_DOUBLE_EQ(LayerActivationBytes(s, b, h, a, t, false, kS), sbh * (10 + 24.0 / t));
    EXPECT_DOUBLE_EQ(LayerActivationBytes(s, b, h, a, t, true, kS), sbh * (34.0 / t));
    EXPECT_DOUBLE_EQ(LayerActivationBytes(s, b, h, a, t, false, kF), 2 * sbh);
    EXPECT_DOUBLE_EQ(LayerActivationBytes(s, b, h, a, 1, false, kF), 2 * sbh);
    // The paper's headline: sp + selective needs about 5x less than tp alone.
    const double ratio = LayerActivationBytes(s, b, h, a, t, false, kN) /
                         LayerActivationBytes(s, b, h, a, t, true, kS);
    EXPECT_GT(ratio, 4.5);
    EXPECT_LT(ratio, 6.5);
  }
}

TEST(Activations, RowNamesSayWhichFormula) {
  EXPECT_STREQ(ActivationRow(8, true, Recompute::kSelective), "tp+sp+selective: sbh(34/t)");
  EXPECT_STREQ(ActivationRow(8, false, Recompute::kNone), "tp: sbh(10+24/t+5as/(ht))");
  EXPECT_STREQ(ActivationRow(1, false, Recompute::kFull), "full recompute: 2sbh");
}

Job KeelJob(const std::string& model, int world, int batch) {
  Job job;
  job.model = NamedModel(model);
  job.global_batch = batch;
  job.cluster.accel = NamedAccelerator("H100-80GB");
  job.cluster.world = world;
  job.cluster.per_node = 8;
  return job;
}

// The search offers only layouts the trainer runs: every estimate passes CheckLayout (ZeRO 2/3
// refused with pipeline stages, fewer micro-batches than stages, tp not dividing the kv heads or
// the padded vocabulary), and a request only refused layouts meet says the trainer's reason.
TEST(Search, OffersOnlyLayoutsTheTrainerRuns) {
  for (const char* model : {"7B", "llama3-8b", "gpt2-xl"}) {
    const Job job = KeelJob(model, 16, 64);
    const std::vector<Estimate> all = Search(job, Constraints{});
    ASSERT_FALSE(all.empty()) << model;
    for (const Estimate& e : all)
      EXPECT_NO_THROW(CheckLayout(job, e.layout))
          << model << ": dp " << e.layout.dp << " tp " << e.layout.tp << " pp " << e.layout.pp
          << " zero " << e.layout.zero << " micro-batch " << e.layout.micro_batch;
  }
  // Split layouts are still offered.
  bool split = false;
  for (const Estimate& e : Search(KeelJob("7B", 16, 64), Constraints{}))
    split = split || e.layout.tp > 1 || e.layout.pp > 1;
  EXPECT_TRUE(split);
  auto refusal = [](const Job& job, const Constraints& c) {
    try {
      Search(job, c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(offered)");
  };
  Constraints c;
  c.pp = 4;
  c.zero = 3;
  EXPECT_NE(refusal(KeelJob("7B", 64, 512), c).find("--zero 3 with --pp 4"), std::string::npos);
  // gpt2-xl's 25 heads take tp 5, its vocabulary padded to 50304 does not; Llama 3 8B's 32 heads
  // take tp 16, its 8 kv heads do not. The old search offered both.
  Constraints tp5;
  tp5.tp = 5;
  EXPECT_NE(refusal(KeelJob("gpt2-xl", 5, 10), tp5).find("50304"), std::string::npos);
  Constraints tp16;
  tp16.tp = 16;
  EXPECT_NE(refusal(KeelJob("llama3-8b", 16, 64), tp16).find("keel train refuses"),
            std::string::npos);
}

// The paper's estimate counts keel's own sums too: DiLoCo's anchor and momentum (8 bytes a
// parameter, 16 streaming) and the int8 wire's residual (4) were left out, and a layout that
// does not fit was called one that does.
TEST(Memory, PaperEstimateCountsDiLoCoAndTheInt8Residual) {
  Job job = KeelJob("7B", 8, 64);
  const Layout l = Layout::Of({8, 1, 1, 0, 1}, 1, Recompute::kFull, false, 1);
  const double psi = ParamsPerRank(job.model, 1, 1);
  const double plain = EstimateMemory(job, l).used();
  job.diloco_inner_steps = 50;
  EXPECT_NEAR(EstimateMemory(job, l).used() - plain, 8 * psi, 1);
  job.diloco_streaming = true;
  EXPECT_NEAR(EstimateMemory(job, l).used() - plain, 16 * psi, 1);
  job.diloco_inner_steps = 0;
  job.diloco_streaming = false;
  job.grad_comm = parallel::GradWire::kInt8;
  EXPECT_NEAR(EstimateMemory(job, l).used() - plain, 4 * psi, 1);
}

TEST(Memory, KeelAccountingIsExactlyWhatTheTrainerAllocates) {
  Job job = KeelJob("gpt2", 1, 4);
  job.accounting = Accounting::kKeel;
  const model::ModelConfig cfg = ToModelConfig(job.model);
  const model::ParamLayout layout = model::ParamLayout::Whole(cfg);
  const double n = double(layout.total());
  EXPECT_EQ(TotalParams(job.model), n);
  Layout l;
  l.micro_batch = 2;
  l.recompute = Recompute::kSelective;
  const MemoryBreakdown m = EstimateMemory(job, l);
  // 18 bytes per parameter, and the fp32 copy of the matrix biases that bf16 products add.
  EXPECT_EQ(m.state.total(), 18 * n + 4 * double(layout.n_bias()));
  EXPECT_TRUE(m.exact_activations);
  EXPECT_EQ(m.activations, double(model::PlanActivations(cfg, 2, cfg.block_size, DType::kBF16,
                                                         model::Recompute::kAttn)
                                      .total_bytes));
}

TEST(Memory, NamedModelsHaveTheirParameterCounts) {
  EXPECT_NEAR(TotalParams(NamedModel("gpt2")), 124.4e6, 0.5e6);
  EXPECT_NEAR(TotalParams(NamedModel("175B")), 175e9, 3e9);
  EXPECT_NEAR(TotalParams(NamedModel("7B")), 6.6e9, 0.3e9);  // GPT shape, 4h MLP
  EXPECT_NEAR(ParamsPerRank(NamedModel("175B"), 8, 1), TotalParams(NamedModel("175B")) / 8, 1);
  // Pipeline stages hold what the trainer gives them: a tied GPT-2's last stage its own wte, an
  // untied Llama's its lm_head alone (its wte was counted twice there).
  for (const char* name : {"gpt2", "llama3-8b"}) {
    const ModelSpec m = NamedModel(name);
    const model::ModelConfig cfg = ToModelConfig(m);
    double busiest = 0;
    for (int s = 0; s < 2; ++s)
      busiest = std::max(busiest,
                         double(model::ParamLayout::Stage(cfg, model::StageOf(cfg, 2, s)).total()));
    EXPECT_NEAR(ParamsPerRank(m, 1, 2), busiest, 1) << name;
  }
}

// Llama-3-8B: 8,030,261,248 parameters; 6N counts the matrix parameters only (not the input
// embedding, which is looked up), attention 12·L·h·s with the query heads' width h.
TEST(Memory, LlamaCountsSwiGluAndGroupedQueryAttentionExactly) {
  const ModelSpec m = NamedModel("llama3-8b");
  EXPECT_EQ(m.family, model::Family::kLlama);
  EXPECT_EQ(TotalParams(m), 8030261248.0);
  const double matmul = 8030261248.0 - 128256.0 * 4096;
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m, TotalParams(m)), 6 * matmul + 12.0 * 32 * 4096 * 8192);
  // Keel's accounting sizes a Llama's activations with the trainer's own plan.
  Job job = KeelJob("llama-120m", 1, 4);
  job.accounting = Accounting::kKeel;
  Layout l;
  l.micro_batch = 2;
  const model::ModelConfig cfg = ToModelConfig(job.model);
  EXPECT_EQ(
      EstimateMemory(job, l).activations,
      double(model::PlanActivations(cfg, 2, cfg.block_size, DType::kBF16, model::Recompute::kNone)
                 .total_bytes));
}

TEST(Time, PipelineRunsAtTheClassifierStagesPace) {
  // GPT-2 124M, seq 1024: a block is 72h² + 12hs = 51.9 MFLOPs per token, the classifier
  // 6Vh = 231.6: the last of 2 equal stages has 543 of 854, i.e. 1.27 times the average.
  const ModelSpec gpt2 = NamedModel("gpt2");
  EXPECT_DOUBLE_EQ(PipelineStageImbalance(gpt2, 1), 1.0);
  EXPECT_NEAR(PipelineStageImbalance(gpt2, 2), 1.27, 0.01);
  EXPECT_GT(PipelineStageImbalance(gpt2, 4), PipelineStageImbalance(gpt2, 2));
  // 175B at pp 8: the classifier is a third of a block beside 12 blocks per stage.
  EXPECT_NEAR(PipelineStageImbalance(NamedModel("175B"), 8), 1.03, 0.01);
}

TEST(Time, BubbleAndMfu) {
  EXPECT_DOUBLE_EQ(PipelineBubble(1, 8), 0);
  EXPECT_DOUBLE_EQ(PipelineBubble(4, 8), 3.0 / 11);
  EXPECT_DOUBLE_EQ(PipelineBubble(4, 8, 2), 3.0 / 22);  // interleaved, 2 chunks per rank
  const ModelSpec m = NamedModel("175B");
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(m, 175e9), 6 * 175e9 + 12.0 * 96 * 12288 * 2048);
  EXPECT_GT(HardwareFlopsPerToken(m, 175e9, Recompute::kFull),
            HardwareFlopsPerToken(m, 175e9, Recompute::kSelective));
}

TEST(Comm, ZeroThreeMovesOneAndAHalfTimesTheDataParallelBytes) {
  Job job = KeelJob("7B", 64, 512);
  Layout l = Layout::Of({64, 1, 1, 0}, 1, Recompute::kFull, false);
  const double base = EstimateComm(job, l).dp_bytes;
  l.zero = 2;
  EXPECT_DOUBLE_EQ(EstimateComm(job, l).dp_bytes, base);
  l.zero = 3;
  EXPECT_DOUBLE_EQ(EstimateComm(job, l).dp_bytes, 1.5 * base);
}

// [parallel] grad_comm: ZeRO 0's gradient all-reduce moves half the bytes in bf16 and 1.016/4 in
// int8 (a float scale per 256); ZeRO 2's weight all-gather stays in the working dtype.
TEST(Comm, GradientWireFormatsScaleTheGradientBytesOnly) {
  Job job = KeelJob("7B", 64, 512);
  job.accounting = Accounting::kKeel;  // fp32 gradients
  Layout l = Layout::Of({64, 1, 1, 0}, 1, Recompute::kFull, false);
  const double fp32 = EstimateComm(job, l).dp_bytes;
  job.grad_comm = parallel::GradWire::kBF16;
  EXPECT_DOUBLE_EQ(EstimateComm(job, l).dp_bytes, fp32 / 2);
  job.grad_comm = parallel::GradWire::kInt8;
  EXPECT_DOUBLE_EQ(EstimateComm(job, l).dp_bytes, fp32 * (1 + 4.0 / 256) / 4);
  l.zero = 2;  // a reduce-scatter in int8 and the bf16 weights' all-gather
  EXPECT_DOUBLE_EQ(EstimateComm(job, l).dp_bytes, fp32 * ((1 + 4.0 / 256) + 2) / 8);
}

// DiLoCo: one sum of the pseudo-gradients per round of inner steps (streaming: dp/2 times the
// bytes, point-to-point); the search keeps to the trainer's ZeRO 0 with data parallelism alone,
// and a layout outside it is one line.
TEST(Comm, DilocoSumsOncePerRoundAndKeepsToDataParallelism) {
  Job job = KeelJob("7B", 64, 512);
  job.accounting = Accounting::kKeel;
  const Layout l = Layout::Of({64, 1, 1, 0}, 1, Recompute::kFull, false);
  const double every_step = EstimateComm(job, l).dp_bytes;
  job.diloco_inner_steps = 50;
  job.grad_comm = parallel::GradWire::kInt8;
  EXPECT_DOUBLE_EQ(EstimateComm(job, l).dp_bytes, every_step * (1 + 4.0 / 256) / 4 / 50);
  // Streaming: point-to-point, dp - 1 copies of each fragment instead of the ring's 2(dp - 1)/dp.
  job.diloco_streaming = true;
  EXPECT_DOUBLE_EQ(EstimateComm(job, l).dp_bytes, every_step * (1 + 4.0 / 256) / 4 / 50 * 32);
  const Layout two = Layout::Of({2, 1, 1, 0}, 1, Recompute::kFull, false);
  job.diloco_streaming = false;
  const double ring_two = EstimateComm(job, two).dp_bytes;
  job.diloco_streaming = true;
  EXPECT_DOUBLE_EQ(EstimateComm(job, two).dp_bytes, ring_two);  // the same bytes at dp 2
  job.diloco_streaming = false;
  Constraints c;
  c.micro_batch = 1;
  c.recompute = {Recompute::kFull};
  for (const Estimate& e : Search(job, c)) {
    EXPECT_EQ(e.layout.zero, 0);
    EXPECT_EQ(e.layout.tp * e.layout.pp, 1);
  }
  c.zero = 1;
  EXPECT_THROW(Search(job, c), Error);
}

// LoRA on Llama-3-8B, rank 16 on every projection: the adapters are 0.44% of the model, the data
// parallel group reduces their fp32 gradients only, the frozen base's dW products leave the FLOPs,
// tp cuts all but the whole factors (whose gradients the tp group sums), ZeRO 3 shards the frozen
// base (a dp-th of its bf16 bytes a rank, gathered for the forward and again for the backward),
// and the search keeps to the trainer's ZeRO 0, 1 and 3, and to the tp an nf4 base's groups allow.
TEST(Lora, AdaptersAloneAreReducedAndTheFrozenBaseSkipsItsWeightGradients) {
  Job job = KeelJob("llama3-8b", 8, 64);
  job.accounting = Accounting::kKeel;
  const double n_full = TotalParams(job.model);
  const double flops_full = ModelFlopsPerToken(job.model, n_full);
  job.model.lora_rank = 16;
  job.model.lora_targets = model::kLoraQkv | model::kLoraProj | model::kLoraFc | model::kLoraFcProj;
  const double n = TotalParams(job.model), adapters = TrainableParams(job.model);
  // Per layer r·(4096 + 6144) + r·(4096 + 4096) + r·(4096 + 2·14336) + r·(14336 + 4096): keel's
  // fused q/k/v and gate/up products share one A each.
  EXPECT_DOUBLE_EQ(adapters, 32.0 * 16 * (10240 + 8192 + 32768 + 18432));
  EXPECT_DOUBLE_EQ(n, n_full + adapters);
  const Layout l = Layout::Of({8, 1, 1, 0}, 1, Recompute::kNone, false);
  EXPECT_DOUBLE_EQ(EstimateComm(job, l).dp_bytes, 2 * (7.0 / 8) * adapters * 4);
  // Whole under tp: q/k/v's and gate/up's A (r, 4096), o's and down's B (4096, r).
  const double whole = 32.0 * 16 * 4 * 4096;
  EXPECT_DOUBLE_EQ(TrainableWholeUnderTp(job.model), whole);
  const Layout t2 = Layout::Of({4, 2, 1, 0}, 1, Recompute::kNone, false);
  EXPECT_DOUBLE_EQ(EstimateComm(job, t2).dp_bytes,
                   2 * (3.0 / 4) * ((adapters - whole) / 2 + whole) * 4);
  Job full = job;
  full.model.lora_rank = 0;
  EXPECT_DOUBLE_EQ(EstimateComm(job, t2).tp_bytes - EstimateComm(full, t2).tp_bytes,
                   2 * (1.0 / 2) * whole * 4);
  // 2 FLOPs per frozen matrix weight fewer (the embedding is a lookup; lm_head is a product).
  EXPECT_DOUBLE_EQ(ModelFlopsPerToken(job.model, n),
                   flops_full + 6 * adapters - 2 * (n_full - 128256.0 * 4096));
  const Layout z1 = Layout::Of({8, 1, 1, 1}, 1, Recompute::kNone, false);
  const Layout z3 = Layout::Of({8, 1, 1, 3}, 1, Recompute::kNone, false);
  EXPECT_DOUBLE_EQ(EstimateComm(job, z1).dp_bytes, 3 * (7.0 / 8) * adapters * 4);
  const double base_bytes = 2 * n;  // bf16, adapters included; each segment's pieces padded
  EXPECT_NEAR(EstimateComm(job, z3).dp_bytes - EstimateComm(job, z1).dp_bytes,
              2 * (7.0 / 8) * base_bytes, 1e-6 * base_bytes);
  EXPECT_NEAR(EstimateMemory(job, z1).state.params, base_bytes, 1e-3 * base_bytes);
  EXPECT_NEAR(EstimateMemory(job, z3).state.params, base_bytes / 8, 1e-3 * base_bytes / 8);
  bool split = false, sharded_base = false;
  for (const Estimate& e : Search(job, Constraints{})) {
    split = split || e.layout.tp > 1;
    sharded_base = sharded_base || e.layout.zero == 3;
    EXPECT_NE(e.layout.zero, 2);
  }
  EXPECT_TRUE(split);
  EXPECT_TRUE(sharded_base);
  EXPECT_THROW(Search(job, Constraints{.zero = 2}), Error);
  // A quantized base is cut as the unquantized one is (int8 rows cut by columns take the whole
  // row's scale); nf4 where each rank's rows are whole groups of 64.
  job.model.lora_base = model::BaseQuant::kInt8;
  split = false;
  for (const Estimate& e : Search(job, Constraints{})) split = split || e.layout.tp > 1;
  EXPECT_TRUE(split);
  Job gpt2 = job;
  gpt2.model = NamedModel("gpt2");
  gpt2.model.lora_rank = 16;
  gpt2.model.lora_base = model::BaseQuant::kNf4;
  Constraints tp;
  tp.tp = 4;  // c_proj's 768 columns: 192 a rank
  EXPECT_NO_THROW(Search(gpt2, tp));
  tp.tp = 8;  // 96 a rank
  EXPECT_THROW(Search(gpt2, tp), Error);
  EXPECT_NE(model::TpQuantProblem(ToModelConfig(gpt2.model), 8).find("h.0.attn.c_proj.weight"),
            std::string::npos);
}

TEST(Search, RanksFittingLayoutsFirstAndRejectsWithReason) {
  const Job job = KeelJob("175B", 64, 512);
  const auto all = Search(job, Constraints{});
  ASSERT_FALSE(all.empty());
  ASSERT_TRUE(all.front().fits);
  for (size_t i = 1; i < all.size() && all[i].fits; ++i)
    EXPECT_GE(all[i - 1].time.tokens_per_s, all[i].time.tokens_per_s);
  // No parallelism for 175B cannot fit in 80 GB.
  Constraints one;
  one.tp = 1;
  one.pp = 1;
  one.zero = 0;
  const auto rejected = Search(job, one);
  for (const auto& e : rejected) {
    EXPECT_FALSE(e.fits);
    EXPECT_NE(e.reason.find("GB"), std::string::npos);
  }
  EXPECT_GT(all.front().time.mfu, 0.05);
  EXPECT_LT(all.front().time.mfu, 1.0);
}

std::string BadInput(const Job& job, const Constraints& c) {
  try {
    Search(job, c);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    return e.what();
  }
  return "";
}

TEST(Search, InvalidRequestsAreOneLineWithTheNumbers) {
  const Job job = KeelJob("7B", 64, 512);
  Constraints c;
  c.tp = 3;
  EXPECT_EQ(BadInput(job, c), "plan: heads 32 % tp 3 = 2: tp must divide the number of heads");
  c = {};
  c.pp = 5;
  EXPECT_EQ(BadInput(job, c), "plan: layers 32 % pp 5 = 2: pp must divide the number of layers");
  c = {};
  c.tp = 8;
  c.pp = 2;
  c.dp = 2;
  EXPECT_EQ(BadInput(job, c), "plan: world 64 != tp 8 x pp 2 x dp 2 = 32");
  c = {};
  c.dp = 64;
  c.micro_batch = 3;
  EXPECT_EQ(BadInput(job, c),
            "plan: global batch 512 is not divisible by dp 64 x micro-batch 3 = 192");
}

}  // namespace
}  // namespace keel::plan

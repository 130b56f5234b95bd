// One source of truth: the planner's bytes for weights, gradients, master weights, AdamW moments
// and activations equal, to the byte, what the trainer allocates. The trainer's buffers are
// keel::Buffer, which takes its memory from aligned_alloc; this test binary interposes
// aligned_alloc and records every size while it builds the step exactly as train/trainer.cc does
// (train::TrainStep: the parameter store, the ZeRO strategy's buffers, the model's arena), for
// one rank of a data-parallel group of 1, 2 or 4 at every ZeRO stage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/pipeline_schedule.h"
#include "keel/plan/memory.h"
#include "keel/train/step.h"

namespace {
std::vector<size_t>* g_recorded = nullptr;  // set only while a test records
}  // namespace

// Replaces glibc's for this executable (dynamic symbol interposition); posix_memalign is the
// same allocator underneath.
extern "C" void* aligned_alloc(size_t alignment, size_t size) {
  void* p = nullptr;
  if (posix_memalign(&p, std::max(alignment, sizeof(void*)), size) != 0) return nullptr;
  if (g_recorded) g_recorded->push_back(size);
  return p;
}

namespace keel::plan {
namespace {

// One rank of a group of `size`, for building a step without MPI: building communicates nothing.
class SilentComm final : public parallel::Comm {
 public:
  SilentComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "silent"; }
  std::unique_ptr<parallel::Work> AllReduceSumAsync(float*, size_t) override { Fail(); }
  std::unique_ptr<parallel::Work> ReduceScatterSumAsync(const float*, float*, size_t) override {
    Fail();
  }
  std::unique_ptr<parallel::Work> AllGatherAsync(const float*, float*, size_t) override { Fail(); }
  std::unique_ptr<parallel::Work> AllReduceSumAsync(void*, size_t, DType) override { Fail(); }
  std::unique_ptr<parallel::Work> ReduceScatterSumAsync(const void*, void*,
                                                        const std::vector<size_t>&,
                                                        DType) override {
    Fail();
  }
  std::unique_ptr<parallel::Work> AllGatherAsync(const void*, void*, const std::vector<size_t>&,
                                                 DType) override {
    Fail();
  }
  std::unique_ptr<parallel::Work> AllToAllAsync(const void*, void*,
                                                const std::vector<size_t>&) override {
    Fail();
  }
  std::unique_ptr<parallel::Work> ThenAsync(std::function<std::string()>) override { Fail(); }
  std::unique_ptr<parallel::Comm> Split(int, int) override { Fail(); }
  void Broadcast(void*, size_t, int) override { Fail(); }
  void Send(const void*, size_t, int) override { Fail(); }
  void Recv(void*, size_t, int) override { Fail(); }
  std::unique_ptr<parallel::Work> SendAsync(const void*, size_t, int, int) override { Fail(); }
  std::unique_ptr<parallel::Work> RecvAsync(void*, size_t, int, int) override { Fail(); }
  void Barrier() override { Fail(); }

 protected:
  void AllReduceDoubles(double*, size_t, bool) override { Fail(); }

 private:
  [[noreturn]] static void Fail() { ThrowRuntime("SilentComm: no communication expected"); }
  int rank_, size_;
};

size_t Round64(double bytes) { return (size_t(bytes) + 63) / 64 * 64; }

// Builds the step as the trainer does, recording every allocation, and finds in them each buffer
// the planner counts: each kind is one buffer (moments: two), as Buffer rounds it (64 bytes); the
// params row is the working copy plus, in bf16, the fp32 biases; what remains is the ZeRO
// strategy's segment buffers, whose sum is the planner's comm_buffers.
void ExpectAllocations(const train::StepSpec& spec, const train::StepGroups& groups,
                       const MemoryBreakdown& plan, int zero) {
  std::vector<size_t> got;
  g_recorded = &got;
  {
    train::TrainStep step(spec, groups);
    g_recorded = nullptr;
  }
  g_recorded = nullptr;
  const int stage = groups.pp ? groups.pp->rank() : 0, pp = groups.pp ? groups.pp->size() : 1;
  const model::TpShard tp{groups.tp ? groups.tp->size() : 1, groups.tp ? groups.tp->rank() : 0};
  // The rank's chunks (virtual stage c·p + s of p·v), each with its own arena.
  const int v = pp > 1 ? spec.layout.virtual_stages : 1;
  std::vector<model::StageRange> chunks;
  for (int c = 0; c < v; ++c)
    chunks.push_back(pp > 1 ? model::StageOf(spec.model, pp * v, c * pp + stage)
                            : model::WholeModel(spec.model));
  const parallel::StateShape shape = parallel::WithTiers(
      model::StateShapeOf(model::ParamLayout::Stage(spec.model, chunks, tp), spec.dtype),
      spec.tiers);
  const parallel::StateBytes b = parallel::StateBytesPerRank(shape, spec.layout);
  ASSERT_EQ(double(b.working + b.biases + b.quantized), plan.state.params);
  std::vector<size_t> want = {Round64(plan.state.grads)};
  if (plan.state.moments > 0) want.insert(want.end(), 2, Round64(plan.state.moments / 2));
  if (plan.state.master > 0) want.push_back(Round64(plan.state.master));
  if (plan.state.offload > 0) want.push_back(Round64(plan.state.offload));
  const std::vector<int> slots = parallel::PipelineSlots(pp, stage, v, spec.layout.n_micro);
  double arenas = 0;
  for (int c = 0; c < v; ++c) {
    const size_t a = model::PlanActivations(
                         spec.model, spec.layout.micro_batch, spec.seq_len / spec.layout.cp,
                         spec.dtype, spec.recompute, &chunks[size_t(c)], slots[size_t(c)], tp.size,
                         spec.layout.sp && tp.size > 1, spec.layout.cp, spec.layout.cp_comm)
                         .total_bytes;
    want.push_back(Round64(double(a)));
    arenas += double(a);
  }
  EXPECT_EQ(arenas, plan.activations);
  // A quantized base: its codes and its scales, two allocations (a LoRA run's at ZeRO 3: within
  // the working copy's packed shard).
  const size_t scales =
      b.quantized ? 4 * model::ParamLayout::Stage(spec.model, chunks, tp).quant_scales() : 0;
  for (size_t x : {b.working, b.biases, b.quantized - scales, scales})
    if (x) want.push_back(Round64(double(x)));
  std::vector<size_t> rest = got;
  for (size_t w : want) {
    auto it = std::find(rest.begin(), rest.end(), w);
    ASSERT_NE(it, rest.end()) << "no allocation of " << w << " bytes";
    rest.erase(it);
  }
  size_t rest_sum = 0;
  for (size_t x : rest) rest_sum += x;
  EXPECT_EQ(double(rest_sum), plan.comm_buffers);
  // The gradient slots: ZeRO 2 and 3's, and bf16 gradients' fp32 buckets; int8's residual.
  EXPECT_EQ(rest.empty(), zero < 2 && spec.tiers.grad_bytes == 4 &&
                              parallel::GradResidualElems(shape, spec.layout) == 0 &&
                              !spec.tiers.diloco);
}

// A job of `world` ranks, one per node, with keel's accounting (the trainer's allocations).
Job KeelJob(const ModelSpec& model, Precision precision, int global_batch, int world) {
  Job job;
  job.model = model;
  job.precision = precision;
  job.accounting = Accounting::kKeel;
  job.global_batch = global_batch;
  job.cluster.world = world;
  job.cluster.per_node = 1;
  job.cluster.accel = NamedAccelerator("H100-80GB");
  return job;
}

// The step `keel train` builds for the planner's job and layout (m micro-batches per step).
train::StepSpec SpecOf(const Job& job, const Layout& l, int m) {
  train::StepSpec spec;
  spec.model = ToModelConfig(job.model);
  spec.dtype = job.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
  spec.tiers = TiersOf(job);
  spec.diloco.inner_steps = job.diloco_inner_steps;
  if (job.diloco_streaming) spec.diloco.fragments = 2;
  if (job.offload_chunk > 0) spec.offload_dir = testing::TempDir() + "keel_trainer_bytes_tier";
  spec.layout = l;  // dp, tp, pp, zero, sp, virtual_stages, micro_batch
  spec.layout.n_micro = m;
  spec.seq_len = spec.model.block_size;
  spec.recompute = l.recompute == Recompute::kNone        ? model::Recompute::kNone
                   : l.recompute == Recompute::kSelective ? model::Recompute::kAttn
                                                          : model::Recompute::kFull;
  return spec;
}

// The planner's memory for `job` at dp ranks (micro-batch 2) and ZeRO `zero`, after checking it
// against the allocations of the last rank's step.
MemoryBreakdown PlannedAndAllocated(const Job& job, int dp, int zero) {
  Layout l;
  l.dp = dp;
  l.zero = zero;
  l.micro_batch = 2;
  const MemoryBreakdown plan = EstimateMemory(job, l);
  SilentComm comm(dp - 1, dp);
  ExpectAllocations(SpecOf(job, l, 1), train::StepGroups{&comm}, plan, zero);
  return plan;
}

struct Case {
  const char* model;
  Precision precision;
  int micro_batch;
  Recompute recompute;
};

TEST(TrainerBytes, PlannerStateAndArenaEqualTheTrainersAllocations) {
  const Case cases[] = {
      {"gpt2-tiny", Precision::kBf16, 2, Recompute::kNone},
      {"gpt2-tiny", Precision::kFp32, 4, Recompute::kSelective},
      {"gpt2-mini", Precision::kBf16, 1, Recompute::kFull},
      {"gpt2-mini", Precision::kFp32, 3, Recompute::kNone},
  };
  for (const Case& c : cases)
    for (int dp : {1, 2, 4})
      for (int zero = 0; zero <= 3; ++zero) {
        const int rank = dp - 1;  // the last rank: its shard may be the short one
        SCOPED_TRACE(std::string(c.model) + " " + PrecisionName(c.precision) + " mb " +
                     std::to_string(c.micro_batch) + " " + RecomputeName(c.recompute) + " dp " +
                     std::to_string(dp) + " zero " + std::to_string(zero));
        const Job job = KeelJob(NamedModel(c.model), c.precision, c.micro_batch * dp, dp);
        Layout l;
        l.dp = dp;
        l.zero = zero;
        l.micro_batch = c.micro_batch;
        l.recompute = c.recompute;
        const MemoryBreakdown plan = EstimateMemory(job, l);
        ASSERT_TRUE(plan.exact_activations);

        const train::StepSpec spec = SpecOf(job, l, 1);
        SilentComm comm(rank, dp);
        ExpectAllocations(spec, train::StepGroups{&comm}, plan, zero);
        // Sharding shrinks what it should: master and moments by dp from ZeRO-1, grads from 2.
        const double n = TotalParams(job.model), shard = std::ceil(n / dp);
        EXPECT_EQ(plan.state.master, 4 * (zero >= 1 ? shard : n));
        EXPECT_EQ(plan.state.moments, 8 * (zero >= 1 ? shard : n));
        EXPECT_EQ(plan.state.grads, 4 * (zero >= 2 ? shard : n));
      }
}

// Context parallelism: the planner's arena is the trainer's to the byte for both ways of moving the
// keys and values, the state is sharded over dp x cp ranks, and the arena less the cp buffers
// (context_parallel.h's, named in CpBufferSizes) is 1/cp of one rank's (to the 64-byte rounding
// of each buffer).
TEST(TrainerBytes, ContextParallelArenaIsThePlannersAndAFractionOfOneRanks) {
  for (parallel::CpComm way : {parallel::CpComm::kRing, parallel::CpComm::kAllGather})
    for (int cp : {2, 4})
      for (int dp : {1, 2})
        for (int zero : {0, 1, 3}) {
          SCOPED_TRACE(std::string(parallel::CpCommName(way)) + " cp " + std::to_string(cp) +
                       " dp " + std::to_string(dp) + " zero " + std::to_string(zero));
          const Job job = KeelJob(NamedModel("gpt2-tiny"), Precision::kBf16, 2 * dp, dp * cp);
          Layout l;
          l.dp = dp, l.cp = cp, l.zero = zero, l.micro_batch = 2, l.cp_comm = way;
          const MemoryBreakdown plan = EstimateMemory(job, l);
          ASSERT_TRUE(plan.exact_activations);
          SilentComm grads(dp * cp - 1, dp * cp), parts(cp - 1, cp);
          ExpectAllocations(SpecOf(job, l, 1),
                            train::StepGroups{&grads, nullptr, nullptr, nullptr, &parts}, plan,
                            zero);
          const double n = TotalParams(job.model), shard = std::ceil(n / (dp * cp));
          EXPECT_EQ(plan.state.moments, 8 * (zero >= 1 ? shard : n));

          Layout one = l;
          one.cp = 1;
          const double whole = EstimateMemory(job, one).activations;
          const model::ModelConfig m = ToModelConfig(job.model);
          const model::ActivationPlan arena =
              model::PlanActivations(m, 2, m.block_size / cp, DType::kBF16, model::Recompute::kNone,
                                     nullptr, 1, 1, false, cp, way);
          double cp_bytes = 0;
          for (const model::ActivationBuffer& b : arena.buffers)
            if (b.name.rfind("cp_", 0) == 0) cp_bytes += double(b.bytes());
          EXPECT_GT(cp_bytes, 0);
          EXPECT_EQ(double(arena.total_bytes), plan.activations);
          EXPECT_LE(plan.activations - cp_bytes, whole / cp + 64.0 * double(arena.buffers.size()));
          EXPECT_GT(plan.activations - cp_bytes, whole / cp - 64.0 * double(arena.buffers.size()));
        }
}

// The smaller state tiers (optim.state_dtype = "bf16", optim.master_weights = false,
// optim.grad_dtype = "bf16"): bf16 moments, no fp32 master and bf16 gradients, counted by the
// planner as the trainer allocates them, to the byte: 18 -> 14 -> 12 (bf16 gradients) -> 10
// bytes per parameter of state (plus the fp32 biases' copy; bf16 gradients' fp32 buckets are
// comm buffers, as ZeRO 2's gradient slots).
TEST(TrainerBytes, Bf16MomentsAndNoMasterAreCountedToTheByte) {
  struct Tier {
    bool bf16_moments, master, bf16_grads;
    double bytes_per_param;
  };
  for (const Tier& t : {Tier{true, true, false, 14}, Tier{false, false, false, 14},
                        Tier{true, true, true, 12}, Tier{true, false, false, 10}})
    for (int dp : {1, 2})
      for (int zero = 0; zero <= 3; ++zero) {
        SCOPED_TRACE(std::string("bf16 moments ") + (t.bf16_moments ? "yes" : "no") + " master " +
                     (t.master ? "yes" : "no") + " bf16 grads " + (t.bf16_grads ? "yes" : "no") +
                     " dp " + std::to_string(dp) + " zero " + std::to_string(zero));
        Job job = KeelJob(NamedModel("gpt2-tiny"), Precision::kBf16, 2 * dp, dp);
        job.bf16_moments = t.bf16_moments;
        job.master = t.master;
        job.bf16_grads = t.bf16_grads;
        const MemoryBreakdown plan = PlannedAndAllocated(job, dp, zero);
        const double n = TotalParams(job.model), held = zero >= 1 ? std::ceil(n / dp) : n;
        EXPECT_EQ(plan.state.moments, (t.bf16_moments ? 4 : 8) * held);
        EXPECT_EQ(plan.state.master, t.master ? 4 * held : 0);
        EXPECT_EQ(plan.state.grads, (t.bf16_grads ? 2 : 4) * (zero >= 2 ? std::ceil(n / dp) : n));
        if (dp == 1)  // the biases' fp32 copy beside the bf16 weights is the rest
          EXPECT_NEAR(plan.state.total() / n, t.bytes_per_param, 0.01);
      }
}

// [parallel] grad_comm = "int8": the error-feedback residual, an fp32 per gradient element on
// every rank at every ZeRO stage (each rank encodes all it sends), counted as a comm buffer;
// bf16 on the wire allocates nothing (its scratch lives while a sum is in flight).
TEST(TrainerBytes, Int8GradientResidualIsCountedToTheByte) {
  for (int dp : {1, 2})
    for (int zero = 0; zero <= 3; ++zero) {
      SCOPED_TRACE("dp " + std::to_string(dp) + " zero " + std::to_string(zero));
      Job job = KeelJob(NamedModel("gpt2-tiny"), Precision::kBf16, 2 * dp, dp);
      const double base = PlannedAndAllocated(job, dp, zero).comm_buffers;
      job.grad_comm = parallel::GradWire::kBF16;
      EXPECT_EQ(PlannedAndAllocated(job, dp, zero).comm_buffers, base);
      job.grad_comm = parallel::GradWire::kInt8;
      const double n = TotalParams(job.model);
      EXPECT_EQ(PlannedAndAllocated(job, dp, zero).comm_buffers, base + (dp > 1 ? 4 * n : 0));
    }
}

// DiLoCo: the anchor and momentum, 8 bytes per parameter at ZeRO 0, int8 pseudo-gradients'
// residual, and streaming's sends and averages (8 more), as the planner counts them.
TEST(TrainerBytes, DilocoOuterStateIsCountedToTheByte) {
  for (bool int8 : {false, true})
    for (bool streaming : {false, true}) {
      SCOPED_TRACE(std::string(int8 ? "int8" : "fp32") + (streaming ? ", streaming" : ""));
      Job job = KeelJob(NamedModel("gpt2-tiny"), Precision::kBf16, 4, 2);
      const double base = PlannedAndAllocated(job, 2, 0).comm_buffers;
      job.diloco_inner_steps = 10;
      job.diloco_streaming = streaming;
      if (int8) job.grad_comm = parallel::GradWire::kInt8;
      const double n = TotalParams(job.model);
      EXPECT_EQ(PlannedAndAllocated(job, 2, 0).comm_buffers,
                base + ((int8 ? 12 : 8) + (streaming ? 8 : 0)) * n);
    }
}

// [offload]: the moments, and a bf16 run's master, leave memory for the tier's file; what stays
// is the chunk buffers, counted by the planner as the trainer allocates them, and the file's
// size is the planner's tier figure.
TEST(TrainerBytes, OffloadTierIsCountedToTheByte) {
  for (Precision p : {Precision::kBf16, Precision::kFp32})
    for (bool bf16_moments : {false, true})
      for (int dp : {1, 2})
        for (int zero = 0; zero <= 3; ++zero) {
          SCOPED_TRACE(std::string(PrecisionName(p)) + (bf16_moments ? " bf16 moments" : "") +
                       " dp " + std::to_string(dp) + " zero " + std::to_string(zero));
          Job job = KeelJob(NamedModel("gpt2-tiny"), p, 2 * dp, dp);
          job.bf16_moments = bf16_moments;
          job.offload_chunk = 1 << 20;  // several chunks: three buffers
          const MemoryBreakdown plan = PlannedAndAllocated(job, dp, zero);
          const double n = TotalParams(job.model), held = zero >= 1 ? std::ceil(n / dp) : n;
          const bool bf16 = p == Precision::kBf16;
          EXPECT_EQ(plan.state.moments, 0);
          EXPECT_EQ(plan.state.master, bf16 ? 0 : 4 * held);  // fp32's master stays
          const double per = (bf16 ? 4 : 0) + (bf16_moments ? 4 : 8);
          EXPECT_GE(plan.tier, per * held);
          EXPECT_LT(plan.tier, per * held + 3 * 4096);
          EXPECT_GT(plan.state.offload, 2 * double(job.offload_chunk));
          EXPECT_LE(plan.state.offload, 3 * double(job.offload_chunk) + 4096);
        }
}

// [offload] params: at ZeRO 3 the 16-bit weights' shard leaves memory for the tier as well (with
// a master and without one, where it is the master), and the allocation is still the planner's.
TEST(TrainerBytes, OffloadedWeightShardIsCountedToTheByte) {
  for (bool master : {true, false})
    for (int dp : {1, 2}) {
      SCOPED_TRACE(std::string(master ? "master" : "no master") + " dp " + std::to_string(dp));
      Job job = KeelJob(NamedModel("gpt2-tiny"), Precision::kBf16, 2 * dp, dp);
      job.master = master;
      job.offload_chunk = 1 << 20;
      const MemoryBreakdown in_memory = PlannedAndAllocated(job, dp, 3);
      job.offload_params = true;
      const MemoryBreakdown on_tier = PlannedAndAllocated(job, dp, 3);
      const double held = std::ceil(TotalParams(job.model) / dp);
      // The weights' shard (2 bytes an element) moved from params to the tier, whole blocks.
      EXPECT_EQ(in_memory.state.params - on_tier.state.params, 2 * held);
      EXPECT_GE(on_tier.tier - in_memory.tier, 2 * held);
      EXPECT_LT(on_tier.tier - in_memory.tier, 2 * held + 4096);
      EXPECT_GT(on_tier.tier_traffic, in_memory.tier_traffic + 4 * held);
      // Below ZeRO 3 every rank holds whole weights: params changes nothing there.
      Job plain = job;
      plain.offload_params = false;
      Layout z1;
      z1.dp = dp;
      z1.zero = 1;
      z1.micro_batch = 2;
      EXPECT_EQ(EstimateMemory(job, z1).used(), EstimateMemory(plain, z1).used());
      EXPECT_EQ(EstimateMemory(job, z1).tier_traffic, EstimateMemory(plain, z1).tier_traffic);
    }
}

// LoRA: the planner's compact state is the trainer's to the byte (master weights and moments of
// the adapters, packed and sharded at ZeRO 1 and 3; their gradients; the working copy holding the
// frozen base, or the part of it a quantized base leaves there and the codes and scales; at ZeRO
// 3 a dp-th of all that, packed per segment), and it is what the adapter count says. DoRA adds
// its magnitudes to the adapters (kept fp32 beside the biases) and its kept products to the arena.
TEST(TrainerBytes, LoraStateIsTheAdaptersAndEqualsThePlanners) {
  using model::BaseQuant;
  struct Case {
    const char* name;
    BaseQuant base;
    bool dora;
  };
  for (Precision prec : {Precision::kBf16, Precision::kFp32})
    for (auto [name, base, dora] : {Case{"gpt2-tiny", BaseQuant::kNone, false},
                                    {"llama-tiny", BaseQuant::kNone, false},
                                    {"gpt2-tiny", BaseQuant::kInt8, false},
                                    {"llama-tiny", BaseQuant::kNf4, false},
                                    {"gpt2-tiny", BaseQuant::kNone, true},
                                    {"llama-tiny", BaseQuant::kInt8, true}})
      for (int dp : {1, 2, 3})
        for (int zero : {0, 1, 3}) {
          SCOPED_TRACE(std::string(name) + " " + PrecisionName(prec) + " dp " + std::to_string(dp) +
                       " zero " + std::to_string(zero) + " base " + model::BaseQuantName(base) +
                       (dora ? " DoRA" : ""));
          ModelSpec m = NamedModel(name);
          m.lora_rank = 4;
          m.lora_targets = model::kLoraQkv | model::kLoraProj | model::kLoraFc | model::kLoraFcProj;
          m.lora_base = base;
          m.lora_dora = dora;
          const Job job = KeelJob(m, prec, 2 * dp, dp);
          const MemoryBreakdown plan = PlannedAndAllocated(job, dp, zero);
          const double n = TotalParams(job.model), adapters = TrainableParams(job.model);
          ASSERT_LT(adapters, n / 10);
          const double held = zero >= 1 ? std::ceil(adapters / dp) : adapters;
          EXPECT_EQ(plan.state.master, 4 * held);
          EXPECT_EQ(plan.state.moments, 8 * held);
          // The adapters' gradients and the frozen norms' scratch (2·C), nothing for the base.
          EXPECT_EQ(plan.state.grads, 4 * (adapters + 2 * job.model.hidden));
          const double wb = prec == Precision::kBf16 ? 2 : 4;
          // Quantized: the blocks' matrices at 1 byte (int8) or half (nf4) and a scale per row or
          // per 64 weights, the rest in the working dtype.
          const model::ParamLayout lay = model::ParamLayout::Whole(plan::ToModelConfig(m));
          const double q = double(lay.quant_elems());
          ASSERT_EQ(q > 0, base != BaseQuant::kNone);
          double rows = 0;
          for (const model::ParamInfo& p : lay.params())
            if (p.quantized()) rows += p.shape[0];
          const double codes = base == BaseQuant::kInt8 ? q : q / 2;
          const double scales = base == BaseQuant::kInt8 ? rows : q / 64;
          const double biases = prec == Precision::kBf16 ? 4 * double(lay.n_bias()) : 0;
          const double whole = wb * (n - q) + codes + 4 * scales;
          if (zero < 3) {
            EXPECT_EQ(plan.state.params, whole + biases);
            continue;
          }
          // ZeRO 3: a dp-th of the whole, with each segment's three pieces padded to 64 bytes.
          const double pad = 3 * 64 * double(lay.segments());
          EXPECT_GE(plan.state.params - biases, whole / dp);
          EXPECT_LE(plan.state.params - biases, (whole + pad) / dp + 4);
        }
}

// Pipeline stages: each stage's store and arenas (its blocks, the embeddings on the first, the
// final LayerNorm and the tied wte copy on the last, the schedule's slots and the boundary
// gradients; one arena per chunk when interleaved) are the planner's for that stage, and the
// plan's figure is the busiest stage's.
TEST(TrainerBytes, EveryPipelineStageEqualsThePlannersFigureForIt) {
  for (Precision prec : {Precision::kBf16, Precision::kFp32})
    for (Recompute rc : {Recompute::kNone, Recompute::kFull})
      for (auto [pp, v] : {std::pair{2, 1}, {4, 1}, {2, 2}})
        for (int dp : {1, 2})
          for (int zero : {0, 1}) {
            const int micro = 2, m = 4;
            Job job = KeelJob(NamedModel("gpt2-mini"), prec, micro * m * dp, dp * pp);  // 4 layers
            // bf16 gradients on half the bf16 cases: their buckets and the tied sum's scratch.
            job.bf16_grads = prec == Precision::kBf16 && (pp + dp + zero) % 2 == 0;
            Layout l;
            l.dp = dp;
            l.pp = pp;
            l.zero = zero;
            l.micro_batch = micro;
            l.recompute = rc;
            l.virtual_stages = v;
            double busiest = 0;
            for (int stage = 0; stage < pp; ++stage) {
              SCOPED_TRACE(std::string(PrecisionName(prec)) + " " + RecomputeName(rc) + " pp " +
                           std::to_string(pp) + " v " + std::to_string(v) + " dp " +
                           std::to_string(dp) + " zero " + std::to_string(zero) + " stage " +
                           std::to_string(stage) + (job.bf16_grads ? " bf16 grads" : ""));
              const MemoryBreakdown plan = KeelStageMemory(job, l, stage);
              busiest = std::max(busiest, plan.used());
              const train::StepSpec spec = SpecOf(job, l, m);
              const bool end = stage == 0 || stage == pp - 1;
              SilentComm dp_comm(dp - 1, dp), pp_comm(stage, pp),
                  tied(stage == 0 ? 0 : 1, end ? 2 : 1);
              ExpectAllocations(spec, train::StepGroups{&dp_comm, &pp_comm, &tied}, plan, zero);
            }
            EXPECT_EQ(EstimateMemory(job, l).used(), busiest);
          }
}

// Tensor-parallel ranks: each holds shards of the same sizes (its heads, hidden units and
// vocabulary rows; LayerNorms, wpe and the projections' biases whole), and its arena holds its
// heads' and hidden units' activations (with sequence parallelism also 1/tp of the residual
// stream's): the planner's figure for tp 2, alone and with pp and dp, with and without sp, equals
// what every tp rank allocates, and sharding shrinks both.
TEST(TrainerBytes, EveryTensorParallelRankEqualsThePlannersFigure) {
  for (Precision prec : {Precision::kBf16, Precision::kFp32})
    for (Recompute rc : {Recompute::kNone, Recompute::kSelective})
      for (int pp : {1, 2})
        for (int dp : {1, 2})
          for (int zero : {0, 1, 3})
            for (bool sp : {false, true}) {
              if (pp > 1 && zero > 1) continue;
              const int micro = 2, m = 2;
              // gpt2-mini: 4 heads, 4 layers
              Job job = KeelJob(NamedModel("gpt2-mini"), prec, micro * m * dp, 2 * dp * pp);
              // bf16 gradients on half the bf16 cases: the tp sums' scratch.
              job.bf16_grads = prec == Precision::kBf16 && (pp + dp + zero + sp) % 2 == 0;
              Layout l;
              l.dp = dp;
              l.tp = 2;
              l.pp = pp;
              l.zero = zero;
              l.micro_batch = micro;
              l.recompute = rc;
              l.sp = sp;
              Layout whole = l;
              whole.tp = 1;
              whole.sp = false;
              Layout no_sp = l;
              no_sp.sp = false;
              const MemoryBreakdown one = KeelStageMemory(job, whole, 0);
              const MemoryBreakdown without = KeelStageMemory(job, no_sp, 0);
              for (int stage = 0; stage < pp; ++stage)
                for (int r = 0; r < 2; ++r) {
                  SCOPED_TRACE(std::string(PrecisionName(prec)) + " " + RecomputeName(rc) + " pp " +
                               std::to_string(pp) + " dp " + std::to_string(dp) + " zero " +
                               std::to_string(zero) + (sp ? " sp" : "") + " stage " +
                               std::to_string(stage) + " tp rank " + std::to_string(r) +
                               (job.bf16_grads ? " bf16 grads" : ""));
                  const MemoryBreakdown plan = KeelStageMemory(job, l, stage);
                  if (stage == 0) {
                    EXPECT_LT(plan.state.master, 0.6 * one.state.master);
                    EXPECT_LT(plan.activations, one.activations);
                    if (sp) {
                      EXPECT_LT(plan.activations, without.activations);
                    }
                  }
                  const train::StepSpec spec = SpecOf(job, l, m);
                  const bool end = stage == 0 || stage == pp - 1;
                  SilentComm dp_comm(dp - 1, dp), pp_comm(stage, pp),
                      tied(stage == 0 ? 0 : 1, end ? 2 : 1), tp_comm(r, 2);
                  ExpectAllocations(spec,
                                    train::StepGroups{&dp_comm, pp > 1 ? &pp_comm : nullptr,
                                                      pp > 1 ? &tied : nullptr, &tp_comm},
                                    plan, zero);
                }
            }
}

// LoRA under tp 2: each rank holds its shard of the cut adapter factors and the whole ones (the
// planner's compact state, to the byte, on every tp rank), fewer than all the adapters; with
// DoRA, its magnitudes cut or whole as B is; an int8 base's codes and scales, its shards'.
TEST(TrainerBytes, LoraUnderTensorParallelismEqualsThePlanners) {
  for (const char* name : {"gpt2-mini", "llama-tiny"})
    for (int dp : {1, 2})
      for (int zero : {0, 1})
        for (int variant = 0; variant < 3; ++variant) {
          const bool dora = variant == 1, int8 = variant == 2;
          ModelSpec m = NamedModel(name);
          m.lora_rank = 4;
          m.lora_targets = model::kLoraQkv | model::kLoraProj | model::kLoraFc | model::kLoraFcProj;
          m.lora_dora = dora;
          if (int8) m.lora_base = model::BaseQuant::kInt8;
          const Job job = KeelJob(m, Precision::kBf16, 2 * dp, 2 * dp);
          Layout l;
          l.dp = dp;
          l.tp = 2;
          l.zero = zero;
          l.micro_batch = 2;
          const MemoryBreakdown plan = KeelStageMemory(job, l, 0);
          const double adapters = TrainableParams(job.model), whole = TrainableWholeUnderTp(m);
          ASSERT_GT(whole, 0);
          EXPECT_EQ(plan.state.grads, 4 * ((adapters - whole) / 2 + whole + 2 * m.hidden));
          for (int r = 0; r < 2; ++r) {
            SCOPED_TRACE(std::string(name) + " dp " + std::to_string(dp) + " zero " +
                         std::to_string(zero) + " tp rank " + std::to_string(r) +
                         (dora ? " DoRA" : "") + (int8 ? " int8 base" : ""));
            SilentComm dp_comm(dp - 1, dp), tp_comm(r, 2);
            ExpectAllocations(SpecOf(job, l, 1),
                              train::StepGroups{&dp_comm, nullptr, nullptr, &tp_comm}, plan, zero);
          }
        }
}

}  // namespace
}  // namespace keel::plan

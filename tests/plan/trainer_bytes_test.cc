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
        Job job;
        job.model = NamedModel(c.model);
        job.precision = c.precision;
        job.accounting = Accounting::kKeel;
        job.global_batch = c.micro_batch * dp;
        job.cluster.world = dp;
        job.cluster.per_node = 1;
        job.cluster.accel = NamedAccelerator("H100-80GB");
        Layout l;
        l.dp = dp;
        l.zero = zero;
        l.micro_batch = c.micro_batch;
        l.recompute = c.recompute;
        const MemoryBreakdown plan = EstimateMemory(job, l);
        ASSERT_TRUE(plan.exact_activations);

        train::StepSpec spec;
        spec.model = ToModelConfig(job.model);
        spec.dtype = c.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
        spec.micro_batch = c.micro_batch;
        spec.seq_len = spec.model.block_size;
        spec.recompute = c.recompute == Recompute::kNone        ? model::Recompute::kNone
                         : c.recompute == Recompute::kSelective ? model::Recompute::kAttn
                                                                : model::Recompute::kFull;
        spec.dims = l;
        SilentComm comm(rank, dp);
        std::vector<size_t> got;
        g_recorded = &got;
        {
          train::TrainStep step(spec, comm);
          g_recorded = nullptr;
        }
        g_recorded = nullptr;

        // Each kind the planner counts is one buffer (moments: two), as Buffer rounds it (64
        // bytes); the params row is the working copy plus, in bf16, the fp32 biases.
        const parallel::StateBytes b = parallel::StateBytesPerRank(
            model::StateShapeOf(model::ParamLayout::Gpt2(spec.model), spec.dtype), l);
        ASSERT_EQ(double(b.working + b.biases), plan.state.params);
        std::vector<size_t> want = {Round64(plan.state.grads), Round64(plan.state.master),
                                    Round64(plan.state.moments / 2),
                                    Round64(plan.state.moments / 2), Round64(plan.activations)};
        for (size_t x : {b.working, b.biases})
          if (x) want.push_back(Round64(double(x)));
        // What remains is the ZeRO strategy's segment buffers: their sum is the planner's.
        std::vector<size_t> rest = got;
        for (size_t w : want) {
          auto it = std::find(rest.begin(), rest.end(), w);
          ASSERT_NE(it, rest.end()) << "no allocation of " << w << " bytes";
          rest.erase(it);
        }
        size_t rest_sum = 0;
        for (size_t x : rest) rest_sum += x;
        EXPECT_EQ(double(rest_sum), plan.comm_buffers);
        EXPECT_EQ(rest.empty(), zero < 2);
        // Sharding shrinks what it should: master and moments by dp from ZeRO-1, grads from 2.
        const double n = TotalParams(job.model), shard = std::ceil(n / dp);
        EXPECT_EQ(plan.state.master, 4 * (zero >= 1 ? shard : n));
        EXPECT_EQ(plan.state.moments, 8 * (zero >= 1 ? shard : n));
        EXPECT_EQ(plan.state.grads, 4 * (zero >= 2 ? shard : n));
      }
}

}  // namespace
}  // namespace keel::plan

// One source of truth: the planner's bytes for weights, gradients, master weights, AdamW moments
// and activations equal, to the byte, what the trainer allocates. The trainer's buffers are
// keel::Buffer, which takes its memory from aligned_alloc; this test binary interposes
// aligned_alloc and records every size while it builds the model and the optimizer exactly as
// train/trainer.cc does (GptModel, then AdamW over the layout's ranges).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "keel/model/gpt.h"
#include "keel/optim/adamw.h"
#include "keel/plan/memory.h"

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
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.model) + " " + PrecisionName(c.precision) + " mb " +
                 std::to_string(c.micro_batch) + " " + RecomputeName(c.recompute));
    Job job;
    job.model = NamedModel(c.model);
    job.precision = c.precision;
    job.accounting = Accounting::kKeel;
    job.global_batch = c.micro_batch;
    job.cluster.world = 1;
    job.cluster.per_node = 1;
    job.cluster.accel = NamedAccelerator("H100-80GB");
    Layout l;
    l.micro_batch = c.micro_batch;
    l.recompute = c.recompute;
    const MemoryBreakdown plan = EstimateMemory(job, l);
    ASSERT_TRUE(plan.exact_activations);

    const model::ModelConfig cfg = ToModelConfig(job.model);
    const DType dt = c.precision == Precision::kBf16 ? DType::kBF16 : DType::kF32;
    const model::Recompute rc = c.recompute == Recompute::kNone        ? model::Recompute::kNone
                                : c.recompute == Recompute::kSelective ? model::Recompute::kAttn
                                                                       : model::Recompute::kFull;
    std::vector<size_t> got;
    g_recorded = &got;
    {
      model::GptModel m(cfg, dt, c.micro_batch, cfg.block_size, rc);
      std::vector<optim::ParamRange> ranges;
      for (const auto& p : m.layout().params()) ranges.push_back({p.offset, p.numel, p.decay});
      optim::AdamW opt(ranges, m.layout().total(), optim::AdamWHyper{});
      g_recorded = nullptr;
    }
    g_recorded = nullptr;

    // What the planner says each kind needs, as Buffer rounds it (to 64 bytes). In fp32 the
    // working weights are the master: one buffer, which the planner counts as "params".
    std::vector<size_t> want = {Round64(plan.state.grads), Round64(plan.state.moments / 2),
                                Round64(plan.state.moments / 2), Round64(plan.activations)};
    want.push_back(Round64(plan.state.params));
    if (plan.state.master > 0) want.push_back(Round64(plan.state.master));
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want);
    // And the byte counts themselves, not only after rounding.
    const double n = TotalParams(job.model);
    EXPECT_EQ(plan.state.total(), (c.precision == Precision::kBf16 ? 18 : 16) * n);
  }
}

}  // namespace
}  // namespace keel::plan

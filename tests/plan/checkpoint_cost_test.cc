// Failures, checkpoints and cost against numbers computed by hand: Young's and Daly's intervals,
// the save and lost-work fractions, and a run's FLOPs, hours, days and money.
#include <gtest/gtest.h>

#include <cmath>

#include "keel/plan/checkpoint_interval.h"
#include "keel/plan/memory.h"
#include "keel/plan/run_cost.h"
#include "keel/plan/search.h"

namespace keel::plan {
namespace {

TEST(CheckpointInterval, YoungIsSqrtTwoDeltaM) {
  // δ = 60 s, M = 24 h: sqrt(2 · 60 · 86400) = sqrt(10368000) ≈ 3219.94 s.
  EXPECT_DOUBLE_EQ(YoungInterval(60, 86400), std::sqrt(2.0 * 60 * 86400));
  EXPECT_NEAR(YoungInterval(60, 86400), 3219.94, 0.01);
}

TEST(CheckpointInterval, DalyAddsTheHigherOrderTerms) {
  const double d = 60, m = 86400, x = d / (2 * m);
  EXPECT_DOUBLE_EQ(DalyInterval(d, m), std::sqrt(2 * d * m) * (1 + std::sqrt(x) / 3 + x / 9) - d);
  EXPECT_NEAR(DalyInterval(d, m), 3180.06, 0.05);  // by hand: 3219.94 × 1.006250 − 60
  // A save that is not small against M: Daly's interval is well below Young's.
  EXPECT_LT(DalyInterval(3600, 4 * 3600), 0.9 * YoungInterval(3600, 4 * 3600));
  // δ ≥ 2M: save once per MTBF.
  EXPECT_DOUBLE_EQ(DalyInterval(3 * 3600, 3600), 3600);
  // δ ≪ M: the two agree.
  EXPECT_NEAR(DalyInterval(1, 1e9) / YoungInterval(1, 1e9), 1, 1e-4);
}

// gpt2 (N from keel's registry) on 16 accelerators in 2 nodes of 8, node MTBF 48 h (M = 24 h),
// with the host copy and storage set so that δ = 60 s and the write to storage takes 600 s.
Job HandJob() {
  Job job;
  job.model = NamedModel("gpt2");
  job.cluster.accel = NamedAccelerator("H100-80GB");
  job.cluster.world = 16;
  job.cluster.per_node = 8;
  job.global_batch = 64;
  const double state = 12 * TotalParams(job.model);
  job.cluster.accel.host_bytes_per_s = state / 16 / 60;
  job.run.storage_bytes_per_s = state / 600;
  job.run.node_mtbf_hours = 48;
  job.run.restart_s = 300;
  return job;
}

TEST(CheckpointPlan, FractionsAndGoodputByHand) {
  const CheckpointPlan c = PlanCheckpoints(HandJob());
  EXPECT_EQ(c.state_bytes, 12 * TotalParams(NamedModel("gpt2")));
  EXPECT_EQ(c.nodes, 2);
  EXPECT_DOUBLE_EQ(c.job_mtbf_s, 86400);
  EXPECT_NEAR(c.blocking_s, 60, 1e-9);
  EXPECT_NEAR(c.write_s, 660, 1e-9);
  EXPECT_NEAR(c.restart_s, 300 + 600, 1e-9);
  EXPECT_NEAR(c.young_s, std::sqrt(2.0 * 60 * 86400), 1e-6);
  EXPECT_NEAR(c.interval_s, DalyInterval(60, 86400), 1e-6);
  const double tau = DalyInterval(60, 86400);
  EXPECT_NEAR(c.save_fraction, 60 / (tau + 60), 1e-12);
  // Half a period lost, plus the 600 s write lag, plus the 900 s restart, once per 86400 s.
  EXPECT_NEAR(c.lost_fraction, ((tau + 60) / 2 + 600 + 900) / 86400, 1e-12);
  EXPECT_NEAR(c.goodput, 1 - 60 / (tau + 60) - ((tau + 60) / 2 + 1500) / 86400, 1e-12);
  EXPECT_NEAR(c.goodput, 0.94537, 1e-5);  // by hand: 1 − 60/3240.06 − 3120.03/86400
}

TEST(CheckpointPlan, TierZeroCopiesByHand) {
  Job job = HandJob();
  const double state = 12 * TotalParams(job.model);
  job.cluster.accel.inter_bytes_per_s = state / 2 / 8 / 20;  // a node's half in 20 s over 8 NICs
  const CheckpointPlan c = PlanCheckpoints(job);
  ASSERT_TRUE(c.peer);
  EXPECT_NEAR(c.peer_send_s, 20, 1e-9);
  EXPECT_NEAR(c.peer_restart_s, 300 + 20, 1e-9);
  const double tau = DalyInterval(60, 86400);
  EXPECT_NEAR(c.peer_interval_s, tau, 1e-6);
  // Both copies lost: the buddy fails within the window around a failure, p = window / 48 h.
  const double p = (tau + 60 + 20 + 320) / (48 * 3600.0);
  EXPECT_NEAR(c.peer_uncovered_mtbf_s, 86400 / p, 1e-3);
  const double shared = DalyInterval(60, 86400 / p);
  EXPECT_NEAR(c.peer_shared_interval_s, shared, 1e-3);
  EXPECT_GT(c.peer_shared_interval_s, 5 * c.peer_interval_s);
  EXPECT_NEAR(c.peer_lost_fraction,
              ((tau + 60) / 2 + 20 + 320) / 86400 + ((shared + 60) / 2 + 600 + 900) / (86400 / p),
              1e-12);
  // A failure costs the buddy's read rather than the shared write lag and read: more goodput.
  EXPECT_GT(c.peer_goodput, c.goodput + 0.005);  // 95.3% against 94.5%
  // One node: no buddy, no tier-0 figures.
  job.cluster.world = 8;
  EXPECT_FALSE(PlanCheckpoints(job).peer);
}

TEST(CheckpointPlan, SlowStorageSetsTheInterval) {
  Job job = HandJob();
  job.run.storage_bytes_per_s = 12 * TotalParams(job.model) / 10000;  // 10000 s per write
  const CheckpointPlan c = PlanCheckpoints(job);
  EXPECT_NEAR(c.interval_s, 10000, 1e-6);  // the next save waits for the previous one
}

TEST(CheckpointPlan, DefaultStorageIsTwoGBPerSecondPerNode) {
  Job job = HandJob();
  job.run.storage_bytes_per_s = 0;
  job.cluster.world = 64;  // 8 nodes
  EXPECT_DOUBLE_EQ(PlanCheckpoints(job).storage_bytes_per_s, 16e9);
}

TEST(CheckpointPlan, FailuresFasterThanSavesLeaveNoGoodput) {
  Job job = HandJob();
  job.run.node_mtbf_hours = 0.01;  // M = 18 s, less than the restart
  const CheckpointPlan c = PlanCheckpoints(job);
  EXPECT_EQ(c.goodput, 0);
  const Estimate e = Evaluate(job, Layout::Of({16, 1, 1, 0}, 1, Recompute::kNone, false));
  EXPECT_TRUE(std::isinf(e.cost.failure_days));
}

TEST(RunCost, HoursDaysAndMoneyFollowFromTokensAndMfu) {
  Job job;
  job.model = NamedModel("7B");
  job.cluster.accel = NamedAccelerator("H100-80GB");
  job.cluster.world = 64;
  job.run.price_per_hour = 2.5;
  const auto all = Search(job, Constraints{});
  ASSERT_TRUE(all.front().fits);
  const Estimate& e = all.front();
  const double n = TotalParams(job.model);
  const ModelSpec& m = job.model;
  EXPECT_TRUE(e.cost.default_tokens);
  EXPECT_DOUBLE_EQ(e.cost.tokens, 20 * n);
  EXPECT_DOUBLE_EQ(e.cost.total_flops, 20 * n * (6 * n + 12.0 * m.layers * m.hidden * m.seq));
  // Another route to the same hours: tokens at the layout's tokens/s, on every accelerator.
  const double hours = e.cost.tokens / e.time.tokens_per_s * 64 / 3600;
  EXPECT_NEAR(e.cost.accel_hours / hours, 1, 1e-9);
  EXPECT_NEAR(e.cost.wall_days, hours / 64 / 24, 1e-9 * hours);
  EXPECT_NEAR(e.cost.money, 2.5 * hours, 1e-9 * hours);
  const double g = e.ckpt.goodput;
  ASSERT_GT(g, 0);
  ASSERT_LT(g, 1);
  EXPECT_NEAR(e.cost.failure_accel_hours, hours * (1 / g - 1), 1e-9 * hours);
  EXPECT_NEAR(e.cost.failure_money, 2.5 * hours * (1 / g - 1), 1e-9 * hours);

  job.run.tokens = 1e12;
  job.run.price_per_hour = 0;
  const Estimate f = Evaluate(job, e.layout);
  EXPECT_FALSE(f.cost.default_tokens);
  EXPECT_DOUBLE_EQ(f.cost.tokens, 1e12);
  EXPECT_NEAR(f.cost.accel_hours / e.cost.accel_hours, 1e12 / (20 * n), 1e-9);
  EXPECT_EQ(f.cost.money, 0);
  EXPECT_EQ(f.cost.failure_money, 0);
}

TEST(RunCost, GptThreeTrainingComputeMatchesThePaper) {
  // Brown et al. 2020, Table D.1: GPT-3 175B on 300B tokens took 3.64e3 petaflop/s-days,
  // i.e. 3.14e23 FLOPs (6N per token). The planner also counts attention's 12Lhs per token
  // (PaLM), about 3% more at s = 2048.
  Job job;
  job.model = NamedModel("175B");
  job.cluster.accel = NamedAccelerator("H100-80GB");
  job.cluster.world = 1024;
  job.global_batch = 1536;
  job.run.tokens = 300e9;
  const Estimate e = Evaluate(job, Layout::Of({16, 8, 8, 1}, 1, Recompute::kSelective, true));
  const double paper = 3.64e3 * 1e15 * 86400;
  EXPECT_NEAR(e.cost.total_flops / paper, 1.03, 0.03);
}

}  // namespace
}  // namespace keel::plan

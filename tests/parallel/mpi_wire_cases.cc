// Multi-process cases of the gradient sums on a wire format (parallel/wire_reduce.h), linked into
// parallel_mpi_test beside mpi_comm_main.cc (np 2 and 3) and run under its rules: every rank runs
// every case in the same order; checks are EXPECT so that a failing rank keeps taking part.
//
// Not named *_test.cc: that would glob it into the single-process parallel_test binary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/parallel/wire_reduce.h"
#include "parallel/mpi_test_comm.h"

namespace keel::parallel {
namespace {

// Rank q's gradient element i: different on every rank, of mixed magnitude.
float Grad(int q, size_t i) {
  return std::sin(0.7f * float(i) + 1.3f * float(q)) * (1.0f + float((i + size_t(q)) % 9));
}

std::vector<float> Mine(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = Grad(g_comm->rank(), i);
  return x;
}

// Every rank's copy of x, bitwise equal? (An all-reduce's replicas must agree.)
bool SameOnEveryRank(const std::vector<float>& x) {
  std::vector<float> all(x.size() * size_t(g_comm->size()));
  EXPECT_TRUE(g_comm->AllGatherAsync(x.data(), all.data(), x.size())->Wait(30));
  for (int q = 0; q < g_comm->size(); ++q)
    if (std::memcmp(all.data() + size_t(q) * x.size(), x.data(), 4 * x.size()) != 0) return false;
  return true;
}

TEST(WireReduce, Bf16AllReduceSumsRoundedPiecesInFp32AndRoundsOnce) {
  const size_t n = 1003;  // not a multiple of the ranks
  std::vector<float> x = Mine(n);
  ASSERT_TRUE(AllReduceOnWire(*g_comm, GradWire::kBF16, x.data(), n, nullptr)->Wait(30));
  for (size_t i = 0; i < n; ++i) {
    float s = 0;
    for (int q = 0; q < g_comm->size(); ++q) s += ToFloat(ToBf16(Grad(q, i)));
    ASSERT_EQ(x[i], ToFloat(ToBf16(s))) << "at " << i;
  }
  EXPECT_TRUE(SameOnEveryRank(x));
}

TEST(WireReduce, ReduceScatterWithUnequalAndEmptyCounts) {
  const int p = g_comm->size(), r = g_comm->rank();
  std::vector<size_t> counts(static_cast<size_t>(p));
  for (int q = 0; q < p; ++q) counts[size_t(q)] = q == 1 ? 0 : size_t(300 + 77 * q);
  size_t total = 0, off = 0;
  for (int q = 0; q < p; ++q) (q < r ? off : total) += counts[size_t(q)];
  total += off;
  std::vector<float> x = Mine(total);
  ASSERT_TRUE(ReduceScatterOnWire(*g_comm, GradWire::kBF16, x.data(), counts, nullptr)->Wait(30));
  for (size_t j = 0; j < counts[size_t(r)]; ++j) {
    float s = 0;
    for (int q = 0; q < p; ++q) s += ToFloat(ToBf16(Grad(q, off + j)));
    ASSERT_EQ(x[j], s) << "at " << j;  // the owner's fp32 sum, not rounded
  }
}

// A segment that one rank owns whole (ZeRO 2's shards often cut so): every rank must choose the
// same MPI path for the all-to-all (comm_mpi.cc's Collective: blocking from 256 KiB), though
// what each receives differs (rank 0 all of it, the others nothing): 100,000 bf16 elements.
TEST(WireReduce, OneOwnerTakesTheWholeSegmentOnEveryRanksPath) {
  const int p = g_comm->size(), r = g_comm->rank();
  std::vector<size_t> counts(static_cast<size_t>(p), 0);
  counts[0] = 100000;
  std::vector<float> x = Mine(counts[0]);
  ASSERT_TRUE(ReduceScatterOnWire(*g_comm, GradWire::kBF16, x.data(), counts, nullptr)->Wait(30));
  if (r == 0)
    for (size_t j = 0; j < counts[0]; j += 997) {
      float s = 0;
      for (int q = 0; q < p; ++q) s += ToFloat(ToBf16(Grad(q, j)));
      ASSERT_EQ(x[j], s) << "at " << j;
    }
}

TEST(WireReduce, Int8AllReduceAgreesEverywhereAndErrorFeedbackCancelsItsBias) {
  const size_t n = 2000;
  std::vector<float> exact(n, 0.0f);
  for (size_t i = 0; i < n; ++i)
    for (int q = 0; q < g_comm->size(); ++q) exact[i] += Grad(q, i);
  // The same gradient sent `rounds` times: without feedback each round repeats the same
  // rounding; with it, the rounds' mean approaches the exact sum.
  constexpr int kRounds = 40;
  std::vector<float> err(n, 0.0f), mean(n, 0.0f);
  double first = 0;
  for (int t = 0; t < kRounds; ++t) {
    std::vector<float> x = Mine(n);
    ASSERT_TRUE(AllReduceOnWire(*g_comm, GradWire::kInt8, x.data(), n, err.data())->Wait(30));
    if (t == 0) {
      EXPECT_TRUE(SameOnEveryRank(x));
      for (size_t i = 0; i < n; ++i) first = std::max(first, double(std::fabs(x[i] - exact[i])));
    }
    for (size_t i = 0; i < n; ++i) mean[i] += x[i] / kRounds;
  }
  double worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, double(std::fabs(mean[i] - exact[i])));
  EXPECT_GT(first, 1e-3);  // int8 does lose something in one round
  // Half a step of each sender's blocks (|g| <= 9) and of the owner's sum's (|sum| <= 9p).
  const double p = g_comm->size();
  EXPECT_LT(first, 0.5 * 9 * p / 127 + 0.5 * 9 * p / 127);
  EXPECT_LT(worst, first / 8);  // and feedback carries it into the next rounds
  EXPECT_TRUE(SameOnEveryRank(mean));
}

// A reduction gives its buffers back for the next one: fresh ones are fresh pages, a step's whole
// gradients' worth of page faults every step. Two in flight at once hold a pair each.
TEST(WireReduce, TheNextReductionTakesTheLastOnesBuffersBack) {
  const size_t n = 4096;
  std::vector<float> x = Mine(n), y = Mine(n);
  ASSERT_TRUE(AllReduceOnWire(*g_comm, GradWire::kBF16, x.data(), n, nullptr)->Wait(30));
  const size_t kept = WireScratchBytesFree();
  EXPECT_GT(kept, 0u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(AllReduceOnWire(*g_comm, GradWire::kBF16, x.data(), n, nullptr)->Wait(30));
    EXPECT_EQ(WireScratchBytesFree(), kept) << "reduction " << i << " made or grew a pair";
  }
  {
    auto a = AllReduceOnWire(*g_comm, GradWire::kBF16, x.data(), n, nullptr);
    auto b = AllReduceOnWire(*g_comm, GradWire::kBF16, y.data(), n, nullptr);
    EXPECT_LT(WireScratchBytesFree(), kept);  // both in flight hold theirs
    ASSERT_TRUE(a->Wait(30));
    ASSERT_TRUE(b->Wait(30));
  }
  EXPECT_GE(WireScratchBytesFree(), kept);
}

}  // namespace
}  // namespace keel::parallel

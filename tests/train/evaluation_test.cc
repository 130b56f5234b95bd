// The evaluation windows: how a dataset is cut (every token after the first predicted once), what a
// batch holds (padding rows count no loss), and that every data-parallel rank runs the same number
// of forward passes. tests/train/eval.sh checks the numbers end to end.
#include "keel/train/evaluation.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "keel/core/error.h"

namespace keel::train {
namespace {

TEST(Evaluation, WindowsCoverTheSplitOnce) {
  const EvalPlan all = PlanEval(1000, 32, 4, 0, "d");
  EXPECT_EQ(all.windows, 31u);  // 999 targets / 32
  EXPECT_EQ(all.batches, 8u);
  EXPECT_EQ(all.tokens(), 992u);
  const EvalPlan first = PlanEval(1000, 32, 4, 10, "d");
  EXPECT_EQ(first.windows, 10u);
  EXPECT_EQ(first.batches, 3u);
  EXPECT_EQ(PlanEval(33, 32, 4, 0, "d").windows, 1u);
  try {
    PlanEval(32, 32, 4, 0, "data/x");
    FAIL() << "a split shorter than one window was accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("data/x: 32 tokens, fewer than one evaluation window of 33"),
        std::string::npos)
        << e.what();
  }
}

TEST(Evaluation, BatchesHoldConsecutiveWindowsAndPadWithoutTargets) {
  const std::string path = testing::TempDir() + "/eval_tokens.u16";
  std::vector<uint16_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint16_t(i);
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(ids.data(), 2, ids.size(), f);
  std::fclose(f);
  const data::TokenDataset ds = data::TokenDataset::Open(path);
  const EvalPlan plan = PlanEval(ds.size(), 32, 4, 0, path);
  std::vector<int32_t> tokens(4 * 32), targets(4 * 32);
  data::SampleWindows windows(ds, 32);
  // Windows 28, 29, 30 and padding.
  EXPECT_EQ(FillEvalBatch(windows, plan, 7, tokens.data(), targets.data()), 3 * 32);
  for (int r = 0; r < 3; ++r)
    for (int t = 0; t < 32; ++t) {
      EXPECT_EQ(tokens[size_t(r * 32 + t)], (28 + r) * 32 + t);
      EXPECT_EQ(targets[size_t(r * 32 + t)], (28 + r) * 32 + t + 1);
    }
  for (int t = 0; t < 32; ++t) EXPECT_EQ(targets[size_t(3 * 32 + t)], -1);

  // A loss of 1 per counted target: the mean is 1 whatever the padding; a data-parallel rank past
  // the last batch still runs its forward pass (8 batches over 3 ranks: 3 rounds each).
  auto comm = parallel::MakeLocalComm();
  int calls = 0;
  auto forward = [&](const int32_t*, const int32_t* y) {
    ++calls;
    double n = 0;
    for (int i = 0; i < 4 * 32; ++i) n += y[i] >= 0;
    return n;
  };
  EXPECT_EQ(Evaluate(ds, plan, *comm, 0, 1, forward, false).loss, 1.0);
  EXPECT_EQ(calls, 8);
  calls = 0;
  (void)Evaluate(ds, plan, *comm, 2, 3, forward, false);
  EXPECT_EQ(calls, 3);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace keel::train

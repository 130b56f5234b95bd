// The state StepGuards keeps in a checkpoint (train/step_guards.h): a skipped step's NaN or
// infinite loss in the recent-loss record survives the manifest's JSON text (written as null),
// so that a resume or a rollback from that checkpoint reads it back instead of throwing.
#include "keel/train/step_guards.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace keel::train {
namespace {

TEST(StepGuards, RecentLossesReadBackWithANanAndAnInfinity) {
  const double inf = std::numeric_limits<double>::infinity();
  const nlohmann::json written = std::vector<double>{2.5, std::nan(""), -inf, 3.0};
  const nlohmann::json read = nlohmann::json::parse(written.dump(1));  // as manifest.cc writes it
  ASSERT_TRUE(read[1].is_null()) << read.dump();
  EXPECT_THROW(read.get<std::vector<double>>(), nlohmann::json::type_error);  // what Restore did
  const std::vector<double> losses = RecentLossesFromJson(read);
  ASSERT_EQ(losses.size(), 4u);
  EXPECT_EQ(losses[0], 2.5);
  EXPECT_TRUE(std::isnan(losses[1]));
  EXPECT_TRUE(std::isnan(losses[2]));
  EXPECT_EQ(losses[3], 3.0);
  EXPECT_TRUE(RecentLossesFromJson(nlohmann::json::array()).empty());
}

}  // namespace
}  // namespace keel::train

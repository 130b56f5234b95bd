// The state StepGuards keeps in a checkpoint (train/step_guards.h): a skipped step's NaN or
// infinite loss in the recent-loss record survives the manifest's JSON text (written as null),
// so that a resume or a rollback from that checkpoint reads it back instead of throwing. And the
// rollbacks' skips (train/guards.h): a skip inside a rolled-back window does not fire again.
#include "keel/train/step_guards.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "data/temp_dir.h"
#include "keel/parallel/comm.h"
#include "keel/train/guards.h"

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

// A rollback from the spike at step 16 (1-based; step index 15) to the checkpoint at 10 skips
// the 12 batches from there to the spike, the 5 and 1 that `skip_batches = "12:5,15:1"` skipped
// at 12 and 15 among them: replayed, those steps must not skip more (fresh data). A skip after
// the window (16, 30) still fires, and the file gives a later run (a resume) the same skips.
TEST(RollbackLog, ASkipInsideTheRolledBackWindowDoesNotFireAgain) {
  data::TempDir dir;
  const std::map<int, int> configured = {{12, 5}, {15, 1}, {16, 2}, {30, 2}};
  const auto comm = parallel::MakeLocalComm();
  EXPECT_FALSE(SharedRollbackFile(*comm, dir / "rollbacks.json"));  // none yet
  RollbackLog log(dir / "rollbacks.json", std::nullopt, configured);
  ASSERT_EQ(log.SkipAt(12), 5);
  log.Record(/*spike_step=*/16, /*to_step=*/10, /*batches=*/12, "loss spike", /*write=*/true);
  const std::optional<std::string> text = SharedRollbackFile(*comm, dir / "rollbacks.json");
  ASSERT_TRUE(text);
  for (const RollbackLog& l : {log, RollbackLog(dir / "rollbacks.json", text, configured)}) {
    EXPECT_EQ(l.SkipAt(10), 12);
    EXPECT_EQ(l.SkipAt(12), 0);
    EXPECT_EQ(l.SkipAt(15), 0);  // the spike's own step: inside the window too
    EXPECT_EQ(l.SkipAt(16), 2);  // never reached before the rollback: still due
    EXPECT_EQ(l.SkipAt(30), 2);
  }
}

}  // namespace
}  // namespace keel::train

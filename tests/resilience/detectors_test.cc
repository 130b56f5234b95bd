// The detectors' pure parts (docs/RESILIENCE.md): KEEL_FAULT parsing and fire-once markers,
// spike verdicts, straggler scores, replica disagreement, and who a hang waits for.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "bad_input.h"
#include "data/temp_dir.h"
#include "keel/core/collective_progress.h"
#include "keel/resilience/fault_inject.h"
#include "keel/resilience/sdc.h"
#include "keel/resilience/spike.h"
#include "keel/resilience/straggler.h"
#include "keel/resilience/watchdog.h"

namespace keel::resilience {
namespace {

TEST(Faults, ParsesKindsStepsRanksAndOptions) {
  auto f = ParseFaults(
      "kill@7:1; hang@3,phase=optimizer ;slow@0:2,factor=2.5;"
      "bitflip@9:0,param=wte.weight,index=4,bit=3,persistent");
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0].kind, FaultKind::kKill);
  EXPECT_EQ(f[0].step, 7);
  EXPECT_EQ(f[0].rank, 1);
  EXPECT_EQ(f[1].rank, -1);
  EXPECT_EQ(f[1].phase, "optimizer");
  EXPECT_DOUBLE_EQ(f[2].factor, 2.5);
  EXPECT_EQ(f[3].param, "wte.weight");
  EXPECT_EQ(f[3].index, 4u);
  EXPECT_EQ(f[3].bit, 3);
  EXPECT_TRUE(f[3].persistent);
  EXPECT_EQ(f[3].id, 3);
}

TEST(Faults, BadSpecsNameTheFaultAndWhatWasExpected) {
  for (const auto& [spec, want] : std::vector<std::pair<std::string, std::string>>{
           {"kil@3", "unknown kind \"kil\""},
           {"kill", "expected KIND@STEP"},
           {"kill@x", "step: expected a whole number"},
           {"kill@3:-1", "rank: expected a whole number"},
           {"hang@3,phase=lunch", "phase: expected data, forward"},
           {"slow@1,factor=0.5", "factor: expected a number in [1, 100]"},
           {"bitflip@2", "bitflip needs param=NAME"},
           {"bitflip@2,param=w,bit=40", "bit: expected 0..31"},
           {"nan_grad@2,colour=red", "unknown option \"colour=red\""}}) {
    const std::string msg = BadInputMessage([&] { ParseFaults(spec); });
    EXPECT_NE(msg.find("KEEL_FAULT: \"" + spec + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << spec << ": " << msg;
  }
}

TEST(Faults, FireOncePerRunAcrossRestartsExceptSlow) {
  data::TempDir dir;
  setenv("KEEL_FAULT", "kill@5:1;slow@2:1,factor=3;nan_grad@4", 1);
  FaultInjector a = FaultInjector::FromEnv(1);
  a.SetMarkerDir(dir / "faults");
  EXPECT_EQ(a.Take(FaultKind::kKill, 4), nullptr);
  ASSERT_NE(a.Take(FaultKind::kKill, 5), nullptr);
  EXPECT_EQ(a.Take(FaultKind::kKill, 5), nullptr);  // fired
  EXPECT_EQ(a.Take(FaultKind::kSlow, 1), nullptr);
  ASSERT_NE(a.Take(FaultKind::kSlow, 9), nullptr);  // lasts
  EXPECT_NE(a.Take(FaultKind::kSlow, 10), nullptr);
  // A restarted process of the same run does not meet the kill again; another rank is untouched
  // by rank 1's faults but meets the every-rank one.
  FaultInjector b = FaultInjector::FromEnv(1);
  b.SetMarkerDir(dir / "faults");
  EXPECT_EQ(b.Take(FaultKind::kKill, 5), nullptr);
  FaultInjector c = FaultInjector::FromEnv(0);
  c.SetMarkerDir(dir / "faults");
  EXPECT_EQ(c.Take(FaultKind::kKill, 5), nullptr);
  EXPECT_NE(c.Take(FaultKind::kNanGrad, 4), nullptr);
  unsetenv("KEEL_FAULT");
}

TEST(Spike, NeedsBothTheZScoreAndTheRatio) {
  SpikeDetector d("loss", {.window = 10, .min_samples = 5, .z = 4, .ratio = 1.5});
  for (double x : {2.0, 2.1, 1.9, 2.05, 1.95}) {
    EXPECT_FALSE(d.Check(x)) << x;
    d.Add(x);
  }
  EXPECT_FALSE(d.Check(2.2));  // within the noise
  EXPECT_FALSE(d.Check(2.9));  // far in deviations, but under 1.5x the median
  auto why = d.Check(6.0);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("loss 6 is"), std::string::npos) << *why;
  EXPECT_FALSE(d.Check(NAN));  // the non-finite check's business
  SpikeDetector noisy("loss", {.window = 10, .min_samples = 5, .z = 4, .ratio = 1.5});
  for (double x : {1.0, 5.0, 1.0, 5.0, 1.0, 5.0}) noisy.Add(x);
  EXPECT_FALSE(noisy.Check(6.0));  // 6x the median, but within the deviation
}

TEST(Spike, WindowRoundTripsThroughJson) {
  SpikeDetector a("loss", {.window = 3, .min_samples = 2, .z = 4, .ratio = 1.5});
  for (double x : {9.0, 1.0, 1.1, 0.9}) a.Add(x);
  SpikeDetector b("loss", {.window = 3, .min_samples = 2, .z = 4, .ratio = 1.5});
  b.FromJson(a.ToJson());
  EXPECT_EQ(b.size(), 3u);  // the 9 fell out of the window
  EXPECT_EQ(a.Check(5.0).has_value(), b.Check(5.0).has_value());
  EXPECT_TRUE(b.Check(5.0));
}

TEST(Straggler, ScoresAgainstTheMedianOfTheOthers) {
  auto s = StragglerScores({100, 200});
  EXPECT_DOUBLE_EQ(s[1], 2.0);
  EXPECT_DOUBLE_EQ(s[0], 0.5);
  s = StragglerScores({100, 100, 300, 110});
  EXPECT_DOUBLE_EQ(s[2], 3.0);
  StragglerTracker t(1.3, 2);
  EXPECT_TRUE(t.Update({100, 100, 150}).empty());
  EXPECT_EQ(t.Update({100, 100, 150}), std::vector<int>{2});
  EXPECT_TRUE(t.Update({100, 100, 150}).empty());  // named once per streak
  EXPECT_TRUE(t.Update({100, 100, 100}).empty());
  EXPECT_EQ(t.streaks()[2], 0);
}

// A pipeline's last stage also runs the head and the loss: ranks are scored against their own
// stage's, so a healthy last stage is not a straggler, and a slow rank within a stage still is.
TEST(Straggler, RanksAreScoredWithinTheirGroup) {
  const std::vector<int> stage = {0, 1, 0, 1};
  for (double s : StragglerScores({100, 200, 100, 200}, stage)) EXPECT_DOUBLE_EQ(s, 1.0);
  EXPECT_DOUBLE_EQ(StragglerScores({100, 200, 100, 200})[1], 2.0);  // across stages: named
  const auto slow = StragglerScores({100, 400, 100, 200, 100, 200}, {0, 1, 0, 1, 0, 1});
  EXPECT_DOUBLE_EQ(slow[1], 2.0);
  EXPECT_DOUBLE_EQ(slow[0], 1.0);
  EXPECT_DOUBLE_EQ(StragglerScores({100, 900}, {0, 1})[1], 1.0);  // alone in its stage
  StragglerTracker t(1.3, 1);
  EXPECT_TRUE(t.Update({100, 200, 100, 200}, stage).empty());
}

TEST(Sdc, TheMinorityIsNamedOnlyWhenThereIsAMajority) {
  EXPECT_TRUE(FindDisagreement({7, 7, 7}).suspects.empty());
  auto d = FindDisagreement({7, 7, 9, 7});
  EXPECT_TRUE(d.majority);
  EXPECT_EQ(d.suspects, std::vector<int>{2});
  d = FindDisagreement({7, 9});
  EXPECT_FALSE(d.majority);
  EXPECT_EQ(d.suspects, (std::vector<int>{0, 1}));
  EXPECT_NE(HashBytes("ab", 2), HashBytes("ac", 2));
}

TEST(Watchdog, TheRankFurthestBehindIsStuck) {
  auto beat = [](int rank, int step, const char* phase) {
    Heartbeat b;
    b.rank = rank;
    b.step = step;
    b.phase = phase;
    b.host = "h" + std::to_string(rank);
    b.time = UnixNow();
    return b;
  };
  EXPECT_EQ(
      StuckRanks({beat(0, 8, "checkpoint"), beat(1, 7, "backward"), beat(2, 8, "checkpoint")}),
      std::vector<int>{1});
  EXPECT_EQ(StuckRanks({beat(0, 7, "optimizer"), beat(1, 7, "backward")}), std::vector<int>{1});
  EXPECT_TRUE(StuckRanks({beat(0, 7, "forward"), beat(1, 7, "forward")}).empty());
  const std::string line = DescribeStuck({beat(0, 8, "checkpoint"), beat(1, 7, "backward")}, {1});
  EXPECT_NE(line.find("rank 1 on h1"), std::string::npos) << line;
  EXPECT_NE(line.find("stuck in step 8, phase backward"), std::string::npos) << line;
}

TEST(Watchdog, NamesThePeerThatHasNotIssuedTheCollective) {
  auto beat = [](int rank, uint64_t world_issued, const char* phase) {
    Heartbeat b;
    b.rank = rank;
    b.pid = 100 + rank;
    b.step = 12;
    b.phase = phase;
    b.host = "h" + std::to_string(rank);
    b.collectives = {{"dp#0", 40, 40, ""}, {"world", world_issued, world_issued, ""}};
    return b;
  };
  const std::vector<GroupProgress> mine = {{"dp#0", 40, 40, ""},
                                           {"world", 57, 56, "MPI_Allreduce"}};
  const std::vector<Heartbeat> beats = {beat(0, 57, "checkpoint"), beat(1, 56, "backward"),
                                        beat(2, 57, "checkpoint")};
  const std::string line = DescribeWait(0, mine, beats);
  EXPECT_NE(line.find("rank 0 waits in world MPI_Allreduce #57: rank 1 on h1 (pid 101) has not "
                      "issued it (it is at #56, in step 13, phase backward)"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("rank 2"), std::string::npos) << line;
  // Nobody behind: said so; waiting in nothing: nothing to say.
  EXPECT_NE(DescribeWait(0, mine, {beat(1, 57, "checkpoint")}).find("every peer"),
            std::string::npos);
  EXPECT_EQ(DescribeWait(0, {{"world", 57, 57, ""}}, beats), "");
}

TEST(Watchdog, ProgressCountsIssuedAndFinishedInOrder) {
  const uint64_t a = NoteIssued("test#9", "MPI_Allreduce");
  const uint64_t b = NoteIssued("test#9", "MPI_Bcast");
  NoteDone("test#9", b);  // out of order: the oldest still waits
  auto find = [] {
    for (const GroupProgress& g : CollectiveProgress())
      if (g.group == "test#9") return g;
    return GroupProgress{};
  };
  EXPECT_EQ(find().issued, b);
  EXPECT_EQ(find().done, a - 1);
  EXPECT_EQ(find().op, "MPI_Allreduce");
  NoteDone("test#9", a);
  EXPECT_EQ(find().done, b);
  EXPECT_EQ(find().op, "");
}

// The operation's name is the progress table's own: the caller's string may be gone (it was a
// dangling pointer, and the heartbeat thread died dumping its garbage as JSON).
TEST(Watchdog, ProgressKeepsItsOwnCopyOfTheName) {
  {
    std::string op = "MPI_Send to rank 12345678";
    NoteIssued("test#8", op);
    op.assign(op.size(), '\xb0');
  }
  int found = 0;
  for (const GroupProgress& g : CollectiveProgress())
    if (g.group == "test#8") found += g.op == "MPI_Send to rank 12345678";
  EXPECT_EQ(found, 1);
  NoteDone("test#8", 1);
  EXPECT_EQ(NoteIssued("", "ignored"), 0u);  // an unnamed group is not counted
}

TEST(Watchdog, FiresOnceWhenAStepOutlivesTheTimeout) {
  std::atomic<int> fired{0};
  std::string said;
  {
    HangWatchdog w(0.3, "", 0, [&](const std::string& line, bool) {
      said = line;
      ++fired;
    });
    w.Arm(4);
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
  }
  EXPECT_EQ(fired.load(), 1);
  EXPECT_NE(said.find("step 5 has not finished"), std::string::npos) << said;
  fired = 0;
  {
    HangWatchdog w(0.5, "", 0, [&](const std::string&, bool) { ++fired; });
    for (int i = 0; i < 6; ++i) {  // steps that finish in time
      w.Arm(i);
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
    w.Disarm();
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
  }
  EXPECT_EQ(fired.load(), 0);
}

}  // namespace
}  // namespace keel::resilience

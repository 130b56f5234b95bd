// The pure parts of monitor/: alert hysteresis (each rule fires once per episode, resolves once),
// the step-time tiling, the ETA and its formatting, resident memory.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <vector>

#include "keel/core/progress.h"
#include "keel/monitor/alerts.h"
#include "keel/monitor/eta.h"
#include "keel/monitor/memory_usage.h"
#include "keel/monitor/step_times.h"

namespace keel::monitor {
namespace {

StepSignals Sig(int step, double loss, double norm, double tokens_per_s = 0,
                bool straggler_checked = false, const std::string& straggler = "") {
  StepSignals s;
  s.step = step;
  s.loss = loss;
  s.grad_norm = norm;
  s.tokens_per_s = tokens_per_s;
  s.straggler_checked = straggler_checked;
  s.straggler = straggler;
  return s;
}

struct Fired {
  std::vector<std::pair<std::string, std::string>> events;  // (event, rule)
  Alerts::Sink sink() {
    return [this](const nlohmann::json& e, const std::string&) {
      events.push_back({e["event"], e["rule"]});
    };
  }
};

TEST(Alerts, NonFiniteFiresOncePerEpisode) {
  Fired f;
  Alerts a(AlertConfig{}, f.sink());
  a.Step(Sig(1, 3.0, 1.0));
  a.Step(Sig(2, NAN, 1.0));
  a.Step(Sig(3, 3.0, NAN));  // still non-finite: no second alert
  a.Step(Sig(4, 3.0, 1.0));
  a.Step(Sig(5, INFINITY, 1.0));
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(f.events,
            (std::vector<P>{
                {"alert", "nonfinite"}, {"alert_resolved", "nonfinite"}, {"alert", "nonfinite"}}));
}

// A loss-scale overflow the scaler answered (an infinite norm of a finite loss, fp16's ordinary
// back-off) is not a fault; a non-finite validation loss is one, though the step's are finite.
TEST(Alerts, NonFiniteSkipsScalerOverflowsAndJudgesValidation) {
  Fired f;
  Alerts a(AlertConfig{}, f.sink());
  StepSignals overflow = Sig(1, 3.0, INFINITY);
  overflow.overflow = true;
  a.Step(overflow);
  EXPECT_TRUE(f.events.empty());
  StepSignals validated = Sig(2, 3.0, 1.0);
  validated.val_loss = 3.2;
  a.Step(validated);
  EXPECT_TRUE(f.events.empty());
  validated.step = 3;
  validated.val_loss = NAN;
  a.Step(validated);
  a.Step(Sig(4, 3.0, 1.0));
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(f.events, (std::vector<P>{{"alert", "nonfinite"}, {"alert_resolved", "nonfinite"}}));
}

TEST(Alerts, LossCeilingWaitsForWarmup) {
  Fired f;
  AlertConfig c;
  c.loss_ceiling = 5;
  c.after_step = 3;
  Alerts a(c, f.sink());
  for (int s = 1; s <= 3; ++s) a.Step(Sig(s, 9.0, 1.0));  // warmup: above, no alert
  EXPECT_TRUE(f.events.empty());
  a.Step(Sig(4, 9.0, 1.0));
  a.Step(Sig(5, 9.5, 1.0));
  a.Step(Sig(6, 4.0, 1.0));
  ASSERT_EQ(f.events.size(), 2u);
  EXPECT_EQ(f.events[0].first, "alert");
  EXPECT_EQ(f.events[1].first, "alert_resolved");
}

TEST(Alerts, ThroughputDropNeedsThreeLowStepsAndThreeToResolve) {
  Fired f;
  AlertConfig c;
  c.throughput_drop = 0.3;
  Alerts a(c, f.sink());
  int s = 0;
  for (int i = 0; i < 20; ++i) a.Step(Sig(++s, 3.0, 1.0, 1000.0 + i % 3));
  a.Step(Sig(++s, 3.0, 1.0, 500.0));  // one slow step (a checkpoint's page cache): nothing
  a.Step(Sig(++s, 3.0, 1.0, 1000.0));
  EXPECT_TRUE(f.events.empty());
  for (int i = 0; i < 10; ++i) a.Step(Sig(++s, 3.0, 1.0, 600.0));  // a slow stretch: one alert
  ASSERT_EQ(f.events.size(), 1u);
  EXPECT_EQ(f.events[0], std::make_pair(std::string("alert"), std::string("throughput_drop")));
  for (int i = 0; i < 3; ++i) a.Step(Sig(++s, 3.0, 1.0, 1000.0));
  ASSERT_EQ(f.events.size(), 2u);
  EXPECT_EQ(f.events[1].first, "alert_resolved");
}

TEST(Alerts, StragglerJudgedOnlyOnCheckSteps) {
  Fired f;
  Alerts a(AlertConfig{}, f.sink());
  a.Step(Sig(5, 3.0, 1.0, 0, true, "rank 1 is slow"));
  a.Step(Sig(6, 3.0, 1.0, 0, false, ""));  // no check: still named
  a.Step(Sig(10, 3.0, 1.0, 0, true, "rank 1 is slow"));
  EXPECT_EQ(f.events.size(), 1u);
  a.Step(Sig(15, 3.0, 1.0, 0, true, ""));
  EXPECT_EQ(f.events.size(), 2u);
}

// The checkpoint folder is made at the first save: until then the disk it will be on is judged
// (statvfs of a missing folder failed, and the rule was silently never judged).
TEST(Alerts, DiskSpaceJudgesAFolderNotMadeYet) {
  std::atomic<bool> fired{false};
  AlertConfig cfg;
  cfg.min_free_disk_gb = 1e12;  // no disk has a zettabyte free
  cfg.disk_path =
      (std::filesystem::temp_directory_path() / "keel_no_such_run/checkpoints").string();
  ASSERT_FALSE(std::filesystem::exists(cfg.disk_path));
  Alerts a(cfg, [&](const nlohmann::json& e, const std::string&) {
    if (e["rule"] == "disk_space" && e["event"] == "alert") fired = true;
  });
  for (int i = 0; i < 40 && !fired; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(fired);
}

// After the last step, the end's work (model file, samples, the last save) is not a stall.
TEST(Alerts, NoStepIsNotJudgedAfterTheStepsEnd) {
  std::atomic<int> ended{0}, stalled{0};  // no_step alerts of each
  AlertConfig cfg;
  cfg.no_step_s = 0.2;
  auto count = [](std::atomic<int>& n) {
    return [&n](const nlohmann::json& e, const std::string&) {
      if (e["rule"] == "no_step") ++n;
    };
  };
  Alerts a(cfg, count(ended)), b(cfg, count(stalled));
  a.Step(Sig(1, 3.0, 1.0));
  b.Step(Sig(1, 3.0, 1.0));
  a.StepsEnded();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(ended, 0);
  EXPECT_EQ(stalled, 1);  // the same wait with steps to come is one
}

TEST(StepTimes, OtherIsWhatThePhasesLeave) {
  StepTimes t;
  t[Phase::kForward] = 30;
  t[Phase::kBackward] = 60;
  t[Phase::kOptimizer] = 8;
  t.CloseWith(100);
  EXPECT_DOUBLE_EQ(t[Phase::kOther], 2);
  EXPECT_DOUBLE_EQ(t.Sum(), 100);
  t.CloseWith(90);  // phases timed past the step: a negative remainder shows the double count
  EXPECT_DOUBLE_EQ(t[Phase::kOther], -8);
  EXPECT_EQ(ShareLine(t, 98), " | fwd 31% bwd 61% opt 8%");
  EXPECT_STREQ(PhaseKey(Phase::kCommDp), "dp_wait_ms");
  EXPECT_STREQ(PhaseName(Phase::kCheckpoint), "checkpoint");
}

TEST(Eta, MedianOfRecentStepsTimesStepsLeft) {
  Eta e(5);
  EXPECT_LT(e.SecondsLeft(10), 0);
  for (double ms : {100.0, 100.0, 5000.0, 100.0, 100.0}) e.Add(ms);  // one save: ignored
  EXPECT_DOUBLE_EQ(e.SecondsLeft(10), 1.0);
  EXPECT_EQ(FormatDuration(42), "42s");
  EXPECT_EQ(FormatDuration(185), "3m05s");
  EXPECT_EQ(FormatDuration(3725), "1h02m");
  EXPECT_EQ(FormatDuration(2 * 86400 + 3 * 3600 + 5), "2d03h");
}

TEST(Rss, CurrentAndPeakAreRead) {
  std::vector<char> big(64 << 20, 1);  // touched: resident
  const Rss r = ReadRss();
  EXPECT_GT(r.current, 64e6);
  EXPECT_GE(r.peak, r.current);
  EXPECT_EQ(big[123], 1);
}

}  // namespace
}  // namespace keel::monitor

namespace keel {
namespace {

TEST(Progress, AmountsReadAsPeopleWriteThem) {
  EXPECT_EQ(FormatAmount(950, "B"), "950 B");
  EXPECT_EQ(FormatAmount(412e6, "B"), "412 MB");
  EXPECT_EQ(FormatAmount(1.4e9, "B"), "1.40 GB");
  EXPECT_EQ(FormatAmount(81200, "docs"), "81,200 docs");
  EXPECT_EQ(FormatAmount(31022686, "tokens"), "31,022,686 tokens");
}

TEST(Progress, SilentForShortWork) {
  testing::internal::CaptureStderr();
  {
    Progress p("quick", 100, "B");
    p.Update(50);
    p.Finish();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace keel

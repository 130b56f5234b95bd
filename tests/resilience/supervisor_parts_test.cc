// The supervisor's pure parts: hostfiles, spares, elastic placement, launcher command lines,
// heartbeats and goodput accounting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "bad_input.h"
#include "data/temp_dir.h"
#include "keel/resilience/goodput.h"
#include "keel/resilience/heartbeat.h"
#include "keel/resilience/hosts.h"
#include "keel/resilience/launcher.h"

namespace keel::resilience {
namespace {

std::string Write(const data::TempDir& dir, const std::string& text) {
  std::ofstream(dir / "hosts") << text;
  return dir / "hosts";
}

TEST(Hostfile, ReadsNamesAndSlots) {
  data::TempDir dir;
  const auto hosts =
      ReadHostfile(Write(dir, "# cluster\nkh1 slots=2\n\nkh2 slots=4 max_slots=8\nkh3\n"));
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].name, "kh1");
  EXPECT_EQ(hosts[0].slots, 2);
  EXPECT_EQ(hosts[1].slots, 4);
  EXPECT_EQ(hosts[2].slots, 1);
}

TEST(Hostfile, BadLinesNameFileAndLine) {
  data::TempDir dir;
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"kh1 slots=two\n", "hosts:1: \"slots=two\": expected slots=N with N > 0"},
           {"kh1\nkh2 cpus=3\n", "hosts:2: \"cpus=3\": expected slots=N"},
           {"kh1\nkh1\n", "hosts:2: host kh1 is listed twice"},
           {"kh1 slots=0\n", "expected slots=N with N > 0"},
           {"# nothing\n", "lists no host"},
       }) {
    const std::string msg = BadInputMessage([&] { ReadHostfile(Write(dir, text)); });
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  }
  EXPECT_NE(BadInputMessage([&] { ReadHostfile(dir / "none"); }).find("cannot read"),
            std::string::npos);
}

TEST(Hostfile, SparesMustBeHosts) {
  std::vector<Host> hosts(3);
  hosts[0].name = "a", hosts[1].name = "b", hosts[2].name = "c";
  MarkSpares(hosts, "c");
  EXPECT_TRUE(hosts[2].spare);
  EXPECT_FALSE(hosts[0].spare);
  EXPECT_NE(BadInputMessage([&] { MarkSpares(hosts, "c,z"); }).find("\"z\" is not among"),
            std::string::npos);
}

TEST(Placement, FitRanksKeepsTpPpAndTheBatch) {
  EXPECT_EQ(FitRanks(4, {1, 1, 8, 2}), 4);
  EXPECT_EQ(FitRanks(3, {1, 1, 8, 2}), 2);  // dp 3 does not split 8 into micro-batches of 2
  EXPECT_EQ(FitRanks(6, {2, 1, 8, 1}), 4);  // tp 2: dp 3 does not divide 8; dp 2 does
  EXPECT_EQ(FitRanks(5, {2, 2, 8, 1}), 4);
  EXPECT_EQ(FitRanks(3, {2, 2, 8, 1}), 0);
  EXPECT_EQ(FitRanks(4, {1, 1, 6, 4}), 0);  // no dp splits 6 into micro-batches of 4
}

TEST(Placement, SparesReplaceLostHostsThenTheJobShrinks) {
  std::vector<Host> hosts(4);
  for (int i = 0; i < 4; ++i) hosts[i].name = "h" + std::to_string(i + 1);
  hosts[3].spare = true;
  Placement p = Place(hosts, 3, 2, {1, 1, 8, 1});
  EXPECT_EQ(p.ranks, 4);  // 6 slots, but dp 6 does not split the batch of 8: two hosts suffice
  EXPECT_EQ(p.hosts, (std::vector<std::string>{"h1", "h2"}));
  const LayoutRule rule{1, 1, 12, 1};
  p = Place(hosts, 3, 2, rule);
  EXPECT_EQ(p.hosts, (std::vector<std::string>{"h1", "h2", "h3"}));
  EXPECT_TRUE(p.spares_used.empty());
  hosts[1].unhealthy = true;
  p = Place(hosts, 3, 2, rule);
  EXPECT_EQ(p.hosts, (std::vector<std::string>{"h1", "h3", "h4"}));
  EXPECT_EQ(p.spares_used, std::vector<std::string>{"h4"});
  hosts[3].excluded = true;
  p = Place(hosts, 2, 2, rule);
  EXPECT_EQ(p.hosts, (std::vector<std::string>{"h1", "h3"}));
  EXPECT_EQ(p.ranks, 4);
  EXPECT_TRUE(p.spares_used.empty());
  hosts[2].excluded = true;
  p = Place(hosts, 2, 2, rule);
  EXPECT_EQ(p.hosts, std::vector<std::string>{"h1"});
  EXPECT_EQ(p.ranks, 2);
  EXPECT_EQ(p.dp, 2);
}

// A fault drill aimed at a rank on another host reaches it: KEEL_FAULT is forwarded by name.
TEST(Launcher, TheFaultDrillAndKernelChoicesReachRemoteRanks) {
  ::setenv("KEEL_FAULT", "kill@10:3", 1);
  ::unsetenv("KEEL_OFFLOAD_CRASH_AT");
  JobLine job;
  job.launcher = Launcher::kMpirun;
  job.hosts = {"kh1", "kh2"};
  job.ranks = 2;
  job.env = ForwardedEnv();
  ::unsetenv("KEEL_FAULT");
  std::string line;
  for (const std::string& x : JobArgv(job, {"keel", "train"})) line += x + " ";
  EXPECT_NE(line.find("-x KEEL_FAULT "), std::string::npos) << line;
  EXPECT_EQ(line.find("KEEL_OFFLOAD_CRASH_AT"), std::string::npos) << line;  // not set
}

TEST(Launcher, CommandLines) {
  JobLine job;
  job.launcher = Launcher::kMpirun;
  job.hosts = {"kh1", "kh2"};
  job.ranks_per_host = 2;
  job.ranks = 4;
  job.env = {"KEEL_HEARTBEAT_DIR"};
  job.launcher_args = SplitArgs(" --bind-to  none ");
  const auto a = JobArgv(job, {"keel", "train"});
  const std::string line = [&] {
    std::string s;
    for (const auto& x : a) s += x + " ";
    return s;
  }();
  EXPECT_NE(line.find("-x KEEL_HEARTBEAT_DIR -np 4 --host kh1:2,kh2:2 --bind-to none keel train"),
            std::string::npos)
      << line;
  // Unbound unless launcher_args bind: mpirun's default puts a rank on one core when it starts
  // two or fewer. The user's binding is the only one.
  EXPECT_EQ(std::count(a.begin(), a.end(), "--bind-to"), 1) << line;
  job.launcher_args = SplitArgs("--bind-to core --map-by slot:PE=4");
  const auto bound = JobArgv(job, {"keel", "train"});
  EXPECT_EQ(std::count(bound.begin(), bound.end(), "--bind-to"), 1);
  EXPECT_NE(std::find(bound.begin(), bound.end(), "core"), bound.end());
  // Cores per rank (PE) bind them too: --bind-to none would undo it.
  job.launcher_args = SplitArgs("--map-by slot:PE=4");
  const auto pe = JobArgv(job, {"keel", "train"});
  EXPECT_EQ(std::count(pe.begin(), pe.end(), "--bind-to"), 0);
  job.launcher_args.clear();
  const auto unbound = JobArgv(job, {"keel", "train"});
  const auto at = std::find(unbound.begin(), unbound.end(), "--bind-to");
  ASSERT_NE(at, unbound.end());
  EXPECT_EQ(*(at + 1), "none");
  job.launcher = Launcher::kSlurm;
  const auto s = JobArgv(job, {"keel", "train"});
  EXPECT_EQ(s[0], "srun");
  EXPECT_NE(std::find(s.begin(), s.end(), "--nodelist=kh1,kh2"), s.end());
  EXPECT_NE(std::find(s.begin(), s.end(), "--ntasks=4"), s.end());
  const auto h = OnHostArgv(job, "kh2", {"keel", "health"});
  EXPECT_NE(std::find(h.begin(), h.end(), "--nodelist=kh2"), h.end());
  job.launcher = Launcher::kLocal;
  job.ranks = 1;
  EXPECT_EQ(JobArgv(job, {"keel", "train"}), (std::vector<std::string>{"keel", "train"}));
  EXPECT_EQ(ChooseLauncher("auto", true),
            std::getenv("SLURM_JOB_ID") ? Launcher::kSlurm : Launcher::kMpirun);
}

TEST(Heartbeat, WrittenReadAndFinished) {
  data::TempDir dir;
  {
    HeartbeatWriter hb(dir / "beats", 3, 0.05);
    hb.StartedAt(10);
    hb.StepDone(12);
    hb.Set(12, "validate");
    usleep(150000);
    auto beats = ReadHeartbeats(dir / "beats");
    ASSERT_EQ(beats.size(), 1u);
    EXPECT_EQ(beats[0].rank, 3);
    EXPECT_EQ(beats[0].start_step, 10);
    EXPECT_EQ(beats[0].step, 12);
    EXPECT_EQ(beats[0].phase, "validate");
    EXPECT_FALSE(beats[0].exited);
    EXPECT_GT(beats[0].last_step_end, beats[0].loop_start);
    hb.Finish(75, "peer lost");
  }
  auto beats = ReadHeartbeats(dir / "beats");
  ASSERT_EQ(beats.size(), 1u);
  EXPECT_TRUE(beats[0].exited);
  EXPECT_EQ(beats[0].exit_code, 75);
  EXPECT_EQ(beats[0].error, "peer lost");
  ClearHeartbeats(dir / "beats");
  EXPECT_TRUE(ReadHeartbeats(dir / "beats").empty());
  HeartbeatWriter off(dir / "off", 0, 0);  // period 0: writes nothing
  EXPECT_TRUE(ReadHeartbeats(dir / "off").empty());
}

TEST(Goodput, SplitsWallTimeIntoItsCauses) {
  // Start 1: up at 10, steps 0..30 by 40, dies (noticed at 44); start 2 at 50 resumes at 20,
  // trains 20..50 from 55 to 85 and finishes at 86. Wall 0..90.
  std::vector<Attempt> a(2);
  a[0] = {0, 10, 40, 44, 50, 0, 30, "failed: x"};
  a[1] = {50, 55, 85, 86, 0, 20, 50, "finished"};
  const Goodput g = Account(a, 0, 90);
  EXPECT_NEAR(g.wall_s, 90, 1e-9);
  EXPECT_NEAR(g.recompute_s, 10, 1e-9);  // 10 of start 1's 30 steps, at 1 s each
  EXPECT_NEAR(g.useful_s, 50, 1e-9);     // 30 + 30 s trained, less 10
  EXPECT_NEAR(g.detect_s, 4, 1e-9);
  EXPECT_NEAR(g.restart_s, 6, 1e-9);
  EXPECT_NEAR(g.startup_s, 15, 1e-9);
  EXPECT_NEAR(g.other_s, 5, 1e-9);
  EXPECT_EQ(g.restarts, 1);
  EXPECT_NEAR(g.goodput(), 50.0 / 90, 1e-12);
}

// A start that dies in its setup (it never reached the loop) between two that trained: the steps
// the first trained past the checkpoint the third resumed from are still recomputed, not counted
// as useful twice.
TEST(Goodput, LossBeforeAFailedStartupIsStillRecomputed) {
  std::vector<Attempt> a(3);
  a[0] = {0, 10, 40, 44, 50, 0, 30, "failed: x"};
  a[1] = {50, 0, 0, 60, 65, -1, -1, "failed: setup"};
  a[2] = {65, 70, 100, 101, 0, 20, 50, "finished"};
  const Goodput g = Account(a, 0, 105);
  EXPECT_NEAR(g.recompute_s, 10, 1e-9);
  EXPECT_NEAR(g.useful_s, 50, 1e-9);
  EXPECT_EQ(g.restarts, 2);
}

}  // namespace
}  // namespace keel::resilience

// The supervisor behind keel::resilience::Supervise (supervisor.h), in two files: supervisor.cc
// starts the job and watches it (health checks, placement, heartbeats, stop requests, regrowing),
// supervisor_outcome.cc classifies how a start ended and decides what comes next (finish, give
// up, or restart after a backoff, charging the failed hosts). Not for use outside them.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "keel/ckpt/peer_client.h"
#include "keel/core/folder_lock.h"
#include "keel/core/stop_signal.h"
#include "keel/monitor/jsonl.h"
#include "keel/resilience/goodput.h"
#include "keel/resilience/heartbeat.h"
#include "keel/resilience/process.h"
#include "keel/resilience/supervisor.h"

namespace keel::resilience::internal {

// "keel launch: ..." on stdout, flushed.
void Say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

inline std::string ShortHost(const std::string& h) { return h.substr(0, h.find('.')); }

// One host's health check, run through the launcher on that host.
struct HealthResult {
  std::string host;
  bool ok = false;
  std::string problem;
  nlohmann::json report;
  double seconds = 0;
};

// How long the launcher may outlive the last of its ranks.
constexpr double kLauncherGraceS = 10;

class Supervisor {
 public:
  explicit Supervisor(const SupervisorSpec& spec);

  // Start, watch, classify how the start ended, decide: finish, give up, or start again.
  int Run();

 private:
  // One start of the job: where it runs, its accounting, and the launcher's process.
  struct Start {
    int attempt = 0;
    Placement place;
    Attempt a;
    std::unique_ptr<Child> job;
  };
  // What watching a start saw, and what the supervisor did to the job meanwhile.
  struct Watch {
    int status = 0;  // the launcher's waitpid status
    bool killed = false, user_stop = false, regrow = false, ended_by_ranks = false;
    bool resumed = false;  // the "resumed" event is written
    std::string silent;    // "rank 3 on kh2 ..."
    int silent_rank = -1;
    double stop_sent = 0, regrow_checked = 0;
    std::optional<std::future<std::vector<HealthResult>>> regrow_check;
  };
  // How a start ended: its exit code, the ranks' last heartbeats, the job's error lines.
  struct Ending {
    int code = 0;
    std::vector<Heartbeat> beats;
    std::vector<std::string> errors;
  };
  // kClean: exit 0, not killed (finished, stopped with a checkpoint, or stopped to regrow).
  enum class Verdict { kClean, kStopped, kBadInput, kFailure };
  // A failure worth restarting: what it was, and whose.
  struct Failure {
    std::string cause;
    std::vector<const Heartbeat*> culprits;
  };

  JobLine Line(const Placement& p) const {
    JobLine l;
    l.launcher = spec_.launcher;
    l.hosts = p.hosts;
    l.ranks_per_host = p.ranks_per_host;
    l.ranks = p.ranks;
    l.launcher_args = spec_.launcher_args;
    l.env = {"KEEL_HEARTBEAT_DIR", "KEEL_RUN_LOCK_HOLDER"};
    if (spec_.holders.on) l.env.push_back("KEEL_PEER_HOLDERS");
    for (const std::string& v : ForwardedEnv()) l.env.push_back(v);
    return l;
  }
  void HealthCheck(bool only_unhealthy);
  std::vector<HealthResult> CheckHosts(const std::vector<std::string>& names);
  int Finish(int code, const std::string& outcome);
  void Event(nlohmann::json j) {
    j["time"] = UnixNow();
    events_.Write(j);
  }
  std::string History() const;

  // Start: the hosts' health, the placement, the job's command line and process (nullopt: no
  // usable host is left).
  void Announce();
  std::optional<Start> StartJob(int attempt);
  std::vector<std::string> TrainCommand(const Placement& place) const;
  // Tier 0: a live holder on every host of `place`, and $KEEL_PEER_HOLDERS naming them in order.
  void EnsureHolders(const Placement& place);
  void StopHolders();
  ckpt::peer::Address HolderAddress(const std::string& host) const;
  // Watch: until the launcher ends, reacting to a stop request, silent ranks, a launcher that
  // outlives its ranks, and an excluded host coming back.
  Watch WatchJob(Start& s, const StopScope& stop);
  void OnStopRequest(Start& s, Watch& w, const StopScope& stop, double now);
  void CheckHeartbeats(Start& s, Watch& w, double now);
  void CheckLauncherLingers(Start& s, Watch& w, double now);
  void CheckRegrow(Start& s, Watch& w, double now);
  Ending Collect(Start& s, Watch& w);
  // Classify: how the start ended, and for a failure, its cause and culprits.
  static Verdict Classify(const Watch& w, const Ending& e);
  Failure Blame(const Start& s, const Watch& w, const Ending& e) const;
  // Decide: the exit code, or nullopt to start again.
  std::optional<int> EndClean(Start& s, const Watch& w);
  int EndStopped(Start& s, const Watch& w, const Ending& e);
  int EndBadInput(Start& s, const Ending& e);
  void RecordFailure(Start& s, const Watch& w, const Failure& f);
  void ChargeHosts(std::vector<const Heartbeat*> culprits);
  std::optional<int> Restart(const Start& s, const StopScope& stop);

  SupervisorSpec spec_;
  std::vector<Host> hosts_;
  int want_hosts_ = 0;
  int full_ranks_ = 0;
  std::string build_;
  std::string beat_dir_;
  FolderLock lock_;  // the run folder's: one job on it at a time
  monitor::JsonlWriter events_;
  std::vector<Attempt> attempts_;
  std::vector<std::string> history_;  // one line per failure
  std::vector<double> failure_times_;
  int consecutive_ = 0;  // failures since the last start that made progress
  std::map<std::string, std::unique_ptr<Child>> holders_;  // by host
  double wall_start_ = UnixNow();
};

}  // namespace keel::resilience::internal

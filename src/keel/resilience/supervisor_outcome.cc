// How a start of the job ended, and what comes next: the supervisor's classify and decide steps
// (supervisor_internal.h).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "keel/core/error.h"
#include "keel/resilience/supervisor_internal.h"

namespace keel::resilience::internal {
namespace {

// The rank the launcher saw die first, from its own message: mpirun's "process rank 1 with PID
// 0 on node kh2 exited on signal 9", or srun's "srun: error: kh2: task 1: Killed". -1 if none.
int LauncherCulprit(const std::string& output) {
  std::istringstream in(output);
  for (std::string l; std::getline(in, l);) {
    size_t at = l.find("noticed that process rank ");
    if (at != std::string::npos) return std::atoi(l.c_str() + at + 26);
    at = l.find(": task ");
    if (l.rfind("srun: error:", 0) == 0 && at != std::string::npos)
      return std::atoi(l.c_str() + at + 7);
  }
  return -1;
}

// The first rank that exited on bad input (exit 2); nullptr if none.
const Heartbeat* BadInputBeat(const std::vector<Heartbeat>& beats) {
  for (const Heartbeat& b : beats)
    if (b.exited && b.exit_code == int(ExitCode::kBadInput)) return &b;
  return nullptr;
}

}  // namespace

// After the launcher ended: what it left behind is killed, and the ranks' last heartbeats give
// the start's steps.
Supervisor::Ending Supervisor::Collect(Start& s, Watch& w) {
  if (w.regrow_check) w.regrow_check->wait();
  Attempt& a = s.a;
  a.end = UnixNow();
  const int left = KillDescendants(w.killed ? 0.5 : 3.0, [this](pid_t p) {
    for (const auto& [host, child] : holders_)
      if (child && child->pid() == p) return true;
    const std::vector<std::string> argv = CommandLineOf(p);
    return spec_.holders.on && argv.size() > 1 && argv[0] == spec_.holders.keel &&
           argv[1] == "holder";
  });
  s.job->Drain();
  Ending e;
  e.beats = ReadHeartbeats(beat_dir_);
  for (const Heartbeat& b : e.beats) {
    if (b.start_step >= 0 && (a.start_step < 0 || b.loop_start > a.loop_start)) {
      a.start_step = b.start_step;
      a.loop_start = b.loop_start;
    }
    if (b.rank == 0 || a.end_step < 0) {
      a.end_step = std::max(a.end_step, b.step);
      a.last_step_end = std::max(a.last_step_end, b.last_step_end);
    }
  }
  if (w.ended_by_ranks && std::all_of(e.beats.begin(), e.beats.end(),
                                      [](const Heartbeat& b) { return b.exit_code == 0; })) {
    w.killed = false;  // the ranks finished; only the launcher lingered
    w.status = 0;
  }
  e.code = ExitCodeOf(w.status);
  e.errors = s.job->ErrorLines();
  if (left > 0) Say("killed %d process(es) the job left behind", left);
  return e;
}

Supervisor::Verdict Supervisor::Classify(const Watch& w, const Ending& e) {
  if (e.code == 0 && !w.killed) return Verdict::kClean;
  if (w.user_stop) return Verdict::kStopped;
  // Bad input is the same on every try.
  if (BadInputBeat(e.beats) ||
      (e.code == int(ExitCode::kBadInput) && !w.killed && w.silent_rank < 0))
    return Verdict::kBadInput;
  return Verdict::kFailure;
}

// A failure worth restarting: what it was, and whose.
Supervisor::Failure Supervisor::Blame(const Start& s, const Watch& w, const Ending& e) const {
  Failure f;
  std::vector<const Heartbeat*>& culprits = f.culprits;
  for (const Heartbeat& b : e.beats)
    if (b.rank == w.silent_rank) culprits.push_back(&b);
  if (w.silent_rank < 0) {
    // A rank that found the fault in itself, else one that failed other than as a lost peer.
    for (const Heartbeat& b : e.beats)
      if (b.culprit) culprits.push_back(&b);
    for (const Heartbeat& b : e.beats)
      if (culprits.empty() && b.exited && b.exit_code != 0 &&
          b.exit_code != int(ExitCode::kTempFail))
        culprits.push_back(&b);
    const int seen = LauncherCulprit(s.job->Tail(40));
    if (culprits.empty())
      for (const Heartbeat& b : e.beats)
        if (b.rank == seen) culprits.push_back(&b);
    if (culprits.empty() && !w.killed)
      for (const Heartbeat& b : e.beats)
        if (!b.exited) culprits.push_back(&b);  // died without its last beat
  }
  f.cause = w.silent_rank >= 0 ? w.silent : "job " + DescribeStatus(w.status);
  std::string who;
  for (const Heartbeat* c : culprits) {
    who += (who.empty() ? "" : ", ") + ("rank " + std::to_string(c->rank) + " on " + c->host) +
           (c->exited ? " (exit " + std::to_string(c->exit_code) + ")"
                      : " (no last heartbeat: killed or crashed)") +
           " at step " + std::to_string(c->step) + ", phase " + c->phase;
  }
  if (w.silent_rank < 0 && !who.empty()) f.cause += "; " + who;
  if (w.silent_rank < 0 && who.empty() && !e.errors.empty()) f.cause += "; " + e.errors.front();
  return f;
}

std::optional<int> Supervisor::EndClean(Start& s, const Watch& w) {
  Attempt& a = s.a;
  a.outcome = w.regrow ? "regrow" : w.user_stop ? "stopped" : "finished";
  attempts_.push_back(a);
  if (w.regrow) return std::nullopt;
  Event({{"event", w.user_stop ? "stopped" : "finished"}, {"step", a.end_step}});
  Say("%s at step %d", w.user_stop ? "stopped, with a checkpoint," : "finished", a.end_step);
  return Finish(0, a.outcome);
}

int Supervisor::EndStopped(Start& s, const Watch& w, const Ending& e) {
  s.a.outcome = "stopped";
  attempts_.push_back(s.a);
  // Stopped before its training loop, the job had nothing to save: SIGUSR2's default action
  // ended it, and the newest checkpoint stays as it was. One that had resumed and died of the
  // signal was cut short (mid-save, maybe): that is a failure.
  const bool before_loop = !w.resumed && (e.code == 128 + SIGUSR2 ||
                                          (WIFSIGNALED(w.status) && WTERMSIG(w.status) == SIGUSR2));
  Say("the job ended with %s after the stop request%s", DescribeStatus(w.status).c_str(),
      before_loop ? " (it had not resumed training; the newest checkpoint stays)" : "");
  return Finish(e.code == 0 || before_loop ? 0 : 1, "stopped");
}

// Bad input is the same on every try: say it once and stop.
int Supervisor::EndBadInput(Start& s, const Ending& e) {
  const Heartbeat* bad = BadInputBeat(e.beats);
  // The job's own line names the rank the error came from and its host ("keel: error: rank 2 on
  // node2: ...", train/rank_agreement.h); every rank shares it, so the beats alone would name
  // rank 0.
  std::string msg = e.errors.empty() ? "" : e.errors.front().substr(std::strlen("keel: error: "));
  if (msg.empty() && bad) {
    msg = "rank " + std::to_string(bad->rank) + " on " + bad->host + ": " + bad->error;
  } else if (msg.empty()) {
    msg = s.job->Tail(5);
  }
  s.a.outcome = "bad input";
  attempts_.push_back(s.a);
  Say("the job stopped on bad input (exit 2), which a restart would not fix: %s", msg.c_str());
  Finish(2, "bad input");
  return 2;
}

// Says what the failure was and whose, and charges its hosts.
void Supervisor::RecordFailure(Start& s, const Watch& w, const Failure& f) {
  Attempt& a = s.a;
  a.outcome = "failed: " + f.cause;
  attempts_.push_back(a);
  history_.push_back("start " + std::to_string(s.attempt) + ": " + f.cause);
  failure_times_.push_back(a.end);
  Say("start %d failed: %s", s.attempt, f.cause.c_str());
  nlohmann::json fev = {{"event", "failure"},
                        {"attempt", s.attempt},
                        {"cause", f.cause},
                        {"exit", DescribeStatus(w.status)},
                        {"step", a.end_step}};
  if (!f.culprits.empty()) {
    fev["rank"] = f.culprits.front()->rank;
    fev["host"] = f.culprits.front()->host;
  }
  Event(fev);
  ChargeHosts(f.culprits);
}

// Each culprit's host counts a failure; at host_failures it is excluded.
void Supervisor::ChargeHosts(std::vector<const Heartbeat*> culprits) {
  std::vector<std::string> charged;
  // One machine has nowhere else to go: it is never excluded.
  if (spec_.launcher == Launcher::kLocal) culprits.clear();
  for (const Heartbeat* c : culprits) {
    for (Host& h : hosts_) {
      if (ShortHost(h.name) != ShortHost(c->host) ||
          std::find(charged.begin(), charged.end(), h.name) != charged.end())
        continue;
      charged.push_back(h.name);
      if (++h.failures >= spec_.policy.host_failures && !h.excluded) {
        h.excluded = true;
        h.reason = "its ranks failed " + std::to_string(h.failures) + " times";
        Say("host %s excluded: %s", h.name.c_str(), h.reason.c_str());
        Event({{"event", "exclusion"}, {"host", h.name}, {"reason", h.reason}});
      }
    }
  }
}

// Restart, unless the policy says enough: nullopt after the backoff, else the exit code.
std::optional<int> Supervisor::Restart(const Start& s, const StopScope& stop) {
  // Failures so far, this one included: a start that stopped to regrow was no failure.
  const int restarts = int(history_.size());
  if (restarts > spec_.policy.max_restarts) {
    Say("giving up: max_restarts = %d reached. Failures:\n%s", spec_.policy.max_restarts,
        History().c_str());
    return Finish(1, "max restarts");
  }
  if (spec_.policy.window_failures > 0) {
    const double since = s.a.end - 60 * spec_.policy.window_minutes;
    const auto n = std::count_if(failure_times_.begin(), failure_times_.end(),
                                 [&](double t) { return t >= since; });
    if (n >= spec_.policy.window_failures) {
      Say("giving up: %ld failures within %g minutes (window_failures). Failures:\n%s", long(n),
          spec_.policy.window_minutes, History().c_str());
      return Finish(1, "failure window");
    }
  }
  consecutive_ = s.a.end_step > s.a.start_step && s.a.start_step >= 0 ? 1 : consecutive_ + 1;
  const double wait = std::min(spec_.policy.backoff_max_s,
                               spec_.policy.backoff_s * std::pow(2.0, consecutive_ - 1));
  Event({{"event", "restart"}, {"attempt", s.attempt + 1}, {"backoff_s", wait}});
  Say("restarting in %.1f s (restart %d of at most %d)", wait, restarts, spec_.policy.max_restarts);
  for (double t = 0; t < wait; t += 0.1) {
    if (stop.requested()) {
      Say("stop requested while waiting to restart; the newest checkpoint stays as it is");
      return Finish(0, "stopped");
    }
    ::usleep(100000);
  }
  return std::nullopt;
}

}  // namespace keel::resilience::internal

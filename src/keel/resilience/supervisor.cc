#include "keel/resilience/supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/stop_signal.h"
#include "keel/monitor/jsonl.h"
#include "keel/resilience/build_id.h"
#include "keel/resilience/goodput.h"
#include "keel/resilience/heartbeat.h"
#include "keel/resilience/process.h"

namespace keel::resilience {
namespace {

void Say(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::printf("keel launch: %s\n", buf);
  std::fflush(stdout);
}

std::string ShortHost(const std::string& h) { return h.substr(0, h.find('.')); }

// One host's health check, run through the launcher on that host.
struct HealthResult {
  std::string host;
  bool ok = false;
  std::string problem;
  nlohmann::json report;
  double seconds = 0;
};

HealthResult CheckHost(const JobLine& line, const std::string& host,
                       const std::vector<std::string>& command, double timeout_s,
                       const std::string& build) {
  HealthResult r;
  r.host = host;
  const double t0 = UnixNow();
  std::string out;
  int status = 0;
  const bool ended = RunCaptured(OnHostArgv(line, host, command), timeout_s, &out, &status);
  r.seconds = UnixNow() - t0;
  if (!ended) {
    r.problem = "did not answer within " + std::to_string(int(timeout_s)) + " s";
    return r;
  }
  // The report is the last line that parses as a JSON object (launchers may add their own).
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  for (auto it = lines.rbegin(); it != lines.rend() && r.report.is_null(); ++it) {
    const auto j = nlohmann::json::parse(*it, nullptr, false);
    if (j.is_object() && j.contains("ok")) r.report = j;
  }
  if (r.report.is_null()) {
    const std::string last = lines.empty() ? "" : lines.back();
    r.problem =
        "health check failed (" + DescribeStatus(status) + ")" + (last.empty() ? "" : ": " + last);
    return r;
  }
  if (r.report.value("build", "") != build) {
    r.problem =
        "runs another keel build (" + r.report.value("build", "?") + ", here " + build + ")";
    return r;
  }
  for (const auto& p : r.report["problems"])
    r.problem += (r.problem.empty() ? "" : "; ") + p.get<std::string>();
  r.ok = r.report.value("ok", false) && r.problem.empty();
  return r;
}

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

// How long the launcher may outlive the last of its ranks.
constexpr double kLauncherGraceS = 10;

class Supervisor {
 public:
  explicit Supervisor(const SupervisorSpec& spec) : spec_(spec), hosts_(spec.hosts) {
    for (const Host& h : hosts_)
      if (!h.spare) ++want_hosts_;
    full_ranks_ = FitRanks(want_hosts_ * spec_.ranks_per_host, spec_.layout);
    // The first start uses every slot, as mpirun would: a layout that does not take them all is
    // the user's to fix (before anything is written), not a reason to start smaller.
    const int slots = want_hosts_ * spec_.ranks_per_host;
    if (full_ranks_ != slots)
      ThrowBadInput("launch: the layout does not take the " + std::to_string(slots) +
                    " ranks of the hosts (" + std::to_string(want_hosts_) + " x " +
                    std::to_string(spec_.ranks_per_host) + "): tp " +
                    std::to_string(spec_.layout.tp) + " x pp " + std::to_string(spec_.layout.pp) +
                    " must divide it and [train] batch_size " + std::to_string(spec_.layout.batch) +
                    " must split into micro-batches of " + std::to_string(spec_.layout.micro) +
                    " over the data-parallel ranks; change --np ([launch] ranks_per_host) or the "
                    "batch");
    std::filesystem::create_directories(spec_.run_dir + "/logs");
    events_ = monitor::JsonlWriter(spec_.run_dir + "/events.jsonl");
    beat_dir_ = spec_.run_dir + "/heartbeat";
    std::filesystem::create_directories(beat_dir_);
    build_ = BuildIdentity();
  }

  int Run();

 private:
  JobLine Line(const Placement& p) const {
    JobLine l;
    l.launcher = spec_.launcher;
    l.hosts = p.hosts;
    l.ranks_per_host = p.ranks_per_host;
    l.ranks = p.ranks;
    l.launcher_args = spec_.launcher_args;
    l.env = {"KEEL_HEARTBEAT_DIR"};
    for (const char* v : {"OMP_NUM_THREADS", "KEEL_BUILD_TAG", "KEEL_CKPT_CRASH_AT"})
      if (std::getenv(v)) l.env.push_back(v);
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

  SupervisorSpec spec_;
  std::vector<Host> hosts_;
  int want_hosts_ = 0;
  int full_ranks_ = 0;
  std::string build_;
  std::string beat_dir_;
  monitor::JsonlWriter events_;
  std::vector<Attempt> attempts_;
  std::vector<std::string> history_;  // one line per failure
  double wall_start_ = UnixNow();
};

std::vector<HealthResult> Supervisor::CheckHosts(const std::vector<std::string>& names) {
  JobLine line = Line(Placement{});
  std::vector<std::future<HealthResult>> futures;
  for (const std::string& n : names)
    futures.push_back(std::async(std::launch::async, CheckHost, line, n, spec_.health_command,
                                 spec_.policy.health_timeout_s, build_));
  std::vector<HealthResult> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

void Supervisor::HealthCheck(bool only_unhealthy) {
  std::vector<std::string> names;
  for (const Host& h : hosts_)
    if (!h.excluded && (!only_unhealthy || h.unhealthy)) names.push_back(h.name);
  for (const HealthResult& r : CheckHosts(names)) {
    Host& h = *std::find_if(hosts_.begin(), hosts_.end(),
                            [&](const Host& x) { return x.name == r.host; });
    nlohmann::json ev = {{"event", "health"},
                         {"host", r.host},
                         {"ok", r.ok},
                         {"seconds", r.seconds},
                         {"problem", r.problem}};
    if (r.report.contains("matmul_gflops")) ev["matmul_gflops"] = r.report["matmul_gflops"];
    Event(ev);
    if (r.ok) {
      if (h.unhealthy) Say("host %s is healthy again (%.1f s)", r.host.c_str(), r.seconds);
      h.unhealthy = false;
      continue;
    }
    if (!h.unhealthy) {
      Say("host %s failed its health check (%.1f s): %s; excluded", r.host.c_str(), r.seconds,
          r.problem.c_str());
      Event({{"event", "exclusion"}, {"host", r.host}, {"reason", r.problem}});
    }
    h.unhealthy = true;
    h.reason = r.problem;
  }
}

std::string Supervisor::History() const {
  std::string s;
  for (size_t i = 0; i < history_.size(); ++i)
    s += "  " + std::to_string(i + 1) + ". " + history_[i] + "\n";
  return s;
}

int Supervisor::Finish(int code, const std::string& outcome) {
  const Goodput g = Account(attempts_, wall_start_, UnixNow());
  nlohmann::json summary = g.ToJson();
  summary["outcome"] = outcome;
  summary["exit_code"] = code;
  summary["failures"] = history_;
  for (const Attempt& a : attempts_)
    summary["attempts"].push_back({{"spawn", a.spawn},
                                   {"loop_start", a.loop_start},
                                   {"last_step_end", a.last_step_end},
                                   {"end", a.end},
                                   {"start_step", a.start_step},
                                   {"end_step", a.end_step},
                                   {"outcome", a.outcome}});
  Event({{"event", "launch_end"}, {"outcome", outcome}, {"exit_code", code}, {"goodput", summary}});
  WriteFileAtomic(spec_.run_dir + "/goodput.json", summary.dump(2) + "\n");
  Say("%s", g.Text().c_str());
  return code;
}

int Supervisor::Run() {
  BecomeSubreaper();
  ::setenv("KEEL_HEARTBEAT_DIR", beat_dir_.c_str(), 1);
  StopScope stop;
  std::string names;
  for (const Host& h : hosts_)
    names += (names.empty() ? "" : ", ") + h.name + (h.spare ? " (spare)" : "");
  Say("%s launcher, hosts %s, %d rank(s) per host; run %s", LauncherName(spec_.launcher),
      names.c_str(), spec_.ranks_per_host, spec_.run_dir.c_str());
  Event({{"event", "launch_start"},
         {"launcher", LauncherName(spec_.launcher)},
         {"hosts", names},
         {"ranks_per_host", spec_.ranks_per_host}});
  std::vector<double> failure_times;
  int consecutive = 0;
  for (int attempt = 1;; ++attempt) {
    HealthCheck(false);
    const Placement place = Place(hosts_, want_hosts_, spec_.ranks_per_host, spec_.layout);
    if (place.ranks == 0) {
      Say("no usable host is left for the layout (tp %d x pp %d); giving up after %zu "
          "failure(s):\n%s",
          spec_.layout.tp, spec_.layout.pp, history_.size(), History().c_str());
      return Finish(1, "no hosts");
    }
    std::vector<std::string> cmd = spec_.train_command;
    cmd.insert(cmd.end(), {"--resume", "auto"});
    const int full_dp = full_ranks_ / (spec_.layout.tp * spec_.layout.pp);
    if (place.dp != full_dp && spec_.set_dp)
      cmd.insert(cmd.end(), {"--set", "parallel.dp=" + std::to_string(place.dp)});
    if (spec_.set_micro)
      cmd.insert(cmd.end(),
                 {"--set", "train.micro_batch_size=" + std::to_string(spec_.layout.micro)});
    std::string where;
    for (const auto& h : place.hosts) where += (where.empty() ? "" : ", ") + h;
    Say("start %d: %d rank(s) on %s, dp %d%s%s", attempt, place.ranks, where.c_str(), place.dp,
        place.ranks < full_ranks_ ? " (shrunk: the global batch is kept by accumulation)" : "",
        place.spares_used.empty() ? "" : " (with spare hosts)");
    nlohmann::json start_ev = {{"event", "job_start"}, {"attempt", attempt},
                               {"ranks", place.ranks}, {"dp", place.dp},
                               {"hosts", place.hosts}, {"spares_used", place.spares_used}};
    Event(start_ev);
    ClearHeartbeats(beat_dir_);
    Attempt a;
    a.spawn = UnixNow();
    if (!attempts_.empty()) attempts_.back().next_spawn = a.spawn;
    char log[64];
    std::snprintf(log, sizeof log, "/logs/launch_%03d.log", attempt);
    const JobLine line = Line(place);
    Child job(JobArgv(line, cmd), spec_.run_dir + log, /*echo=*/true);

    // Watch: the job's end, the ranks' heartbeats, a stop request, a host coming back.
    int status = 0;
    bool killed = false, user_stop = false, regrow = false, ended_by_ranks = false;
    bool resumed = false;  // the "resumed" event is written
    std::string silent;    // "rank 3 on kh2 ..."
    int silent_rank = -1;
    double stop_sent = 0, regrow_checked = UnixNow();
    std::optional<std::future<std::vector<HealthResult>>> regrow_check;
    while (!job.Poll(&status)) {
      ::usleep(200000);
      const double now = UnixNow();
      if (stop.requested() && !user_stop) {
        user_stop = true;
        stop_sent = now;
        Say("stop requested: the job saves a checkpoint and exits (up to %.0f s)",
            spec_.policy.stop_grace_s);
        ::kill(job.pid(), SIGUSR2);  // mpirun forwards it to every rank
      }
      if (stop_sent > 0 && now - stop_sent > spec_.policy.stop_grace_s && !killed) {
        Say("the job did not stop within stop_grace_s; killing it");
        job.Signal(SIGKILL);
        killed = true;
      }
      if (silent_rank < 0 && stop_sent == 0 && spec_.policy.heartbeat_timeout_s > 0) {
        const double limit = spec_.policy.heartbeat_timeout_s;
        const std::vector<Heartbeat> beats = ReadHeartbeats(beat_dir_);
        std::map<int, const Heartbeat*> by_rank;
        for (const auto& b : beats) by_rank[b.rank] = &b;
        if (!resumed && by_rank.count(0) && by_rank[0]->start_step >= 0) {
          resumed = true;
          Event({{"event", "resumed"},
                 {"attempt", attempt},
                 {"step", by_rank[0]->start_step},
                 {"seconds", by_rank[0]->loop_start - a.spawn}});
        }
        for (int r = 0; r < place.ranks && silent_rank < 0; ++r) {
          auto it = by_rank.find(r);
          if (it == by_rank.end()) {
            if (now - a.spawn > limit) {
              silent_rank = r;
              silent = "rank " + std::to_string(r) + " never sent a heartbeat in " +
                       std::to_string(int(limit)) + " s";
            }
          } else if (!it->second->exited && now - it->second->time > limit) {
            const Heartbeat& b = *it->second;
            silent_rank = r;
            char buf[256];
            std::snprintf(buf, sizeof buf,
                          "rank %d on %s (pid %lld) is silent: last heartbeat %.0f s ago, at "
                          "step %d, phase %s",
                          r, b.host.c_str(), (long long)b.pid, now - b.time, b.step,
                          b.phase.c_str());
            silent = buf;
          }
        }
        if (silent_rank >= 0) {
          Say("%s; stopping the job", silent.c_str());
          job.Signal(SIGTERM);
          if (!job.Wait(10, &status)) job.Signal(SIGKILL);
          killed = true;
        }
      }
      // Every rank has said how it ended, but the launcher still waits (mpirun for a daemon
      // on a host it can no longer reach): end it.
      if (!killed && place.ranks > 0) {
        const std::vector<Heartbeat> beats = ReadHeartbeats(beat_dir_);
        const bool all_out =
            int(beats.size()) == place.ranks &&
            std::all_of(beats.begin(), beats.end(), [](const Heartbeat& b) { return b.exited; });
        double last_exit = 0;
        for (const auto& b : beats) last_exit = std::max(last_exit, b.time);
        if (all_out && now - last_exit > kLauncherGraceS) {
          Say("every rank has exited but the launcher has not after %.0f s; ending it",
              kLauncherGraceS);
          job.Signal(SIGTERM);
          if (!job.Wait(5, &status)) job.Signal(SIGKILL);
          killed = true;
          ended_by_ranks = true;
        }
      }
      // While shrunk, see now and then whether an excluded host is back; if so, stop the job
      // (it saves) and start again on more ranks.
      if (spec_.policy.regrow_minutes > 0 && stop_sent == 0 && place.ranks < full_ranks_ &&
          !regrow_check && now - regrow_checked > 60 * spec_.policy.regrow_minutes) {
        std::vector<std::string> out;
        for (const Host& h : hosts_)
          if (h.unhealthy && !h.excluded) out.push_back(h.name);
        regrow_check = std::async(std::launch::async, [this, out] { return CheckHosts(out); });
      }
      if (regrow_check &&
          regrow_check->wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
        regrow_checked = now;
        for (const HealthResult& r : regrow_check->get())
          if (r.ok && stop_sent == 0) {
            Say("host %s is back: stopping the job to restart it on more ranks", r.host.c_str());
            Event({{"event", "regrow"}, {"host", r.host}});
            regrow = true;
            stop_sent = now;
            ::kill(job.pid(), SIGUSR2);
          }
        regrow_check.reset();
      }
    }
    if (regrow_check) regrow_check->wait();
    a.end = UnixNow();
    const int left = KillDescendants(killed ? 0.5 : 3.0);
    job.Drain();
    const std::vector<Heartbeat> beats = ReadHeartbeats(beat_dir_);
    for (const Heartbeat& b : beats) {
      if (b.start_step >= 0 && (a.start_step < 0 || b.loop_start > a.loop_start)) {
        a.start_step = b.start_step;
        a.loop_start = b.loop_start;
      }
      if (b.rank == 0 || a.end_step < 0) {
        a.end_step = std::max(a.end_step, b.step);
        a.last_step_end = std::max(a.last_step_end, b.last_step_end);
      }
    }
    if (ended_by_ranks && std::all_of(beats.begin(), beats.end(),
                                      [](const Heartbeat& b) { return b.exit_code == 0; })) {
      killed = false;  // the ranks finished; only the launcher lingered
      status = 0;
    }
    const int code = ExitCodeOf(status);
    const std::vector<std::string> errors = job.ErrorLines();
    if (left > 0) Say("killed %d process(es) the job left behind", left);

    if (code == 0 && !killed) {
      a.outcome = regrow ? "regrow" : user_stop ? "stopped" : "finished";
      attempts_.push_back(a);
      if (regrow) continue;
      Event({{"event", user_stop ? "stopped" : "finished"}, {"step", a.end_step}});
      Say("%s at step %d", user_stop ? "stopped, with a checkpoint," : "finished", a.end_step);
      return Finish(0, a.outcome);
    }
    if (user_stop) {
      a.outcome = "stopped";
      attempts_.push_back(a);
      // Stopped before its training loop, the job had nothing to save: SIGUSR2's default action
      // ended it, and the newest checkpoint stays as it was.
      const bool before_loop =
          code == 128 + SIGUSR2 || (WIFSIGNALED(status) && WTERMSIG(status) == SIGUSR2);
      Say("the job ended with %s after the stop request%s", DescribeStatus(status).c_str(),
          before_loop ? " (it had not resumed training; the newest checkpoint stays)" : "");
      return Finish(code == 0 || before_loop ? 0 : 1, "stopped");
    }
    // Bad input is the same on every try: say it once and stop.
    const Heartbeat* bad = nullptr;
    for (const Heartbeat& b : beats)
      if (b.exited && b.exit_code == int(ExitCode::kBadInput) && !bad) bad = &b;
    if (bad || (code == int(ExitCode::kBadInput) && !killed && silent_rank < 0)) {
      // The job's own line names the rank the error came from ("keel: error: rank 2: ..."; every
      // rank shares it, so the beats alone would name rank 0): add that rank's host.
      std::string msg = errors.empty() ? "" : errors.front().substr(std::strlen("keel: error: "));
      if (msg.rfind("rank ", 0) == 0) {
        const int r = std::atoi(msg.c_str() + 5);
        for (const Heartbeat& b : beats)
          if (b.rank == r) msg.insert(msg.find(':'), " on " + b.host);
      } else if (msg.empty() && bad) {
        msg = "rank " + std::to_string(bad->rank) + " on " + bad->host + ": " + bad->error;
      } else if (msg.empty()) {
        msg = job.Tail(5);
      }
      a.outcome = "bad input";
      attempts_.push_back(a);
      Say("the job stopped on bad input (exit 2), which a restart would not fix: %s", msg.c_str());
      Finish(2, "bad input");
      return 2;
    }

    // A failure worth restarting: say what it was and whose, and charge its hosts.
    std::vector<const Heartbeat*> culprits;
    for (const Heartbeat& b : beats)
      if (b.rank == silent_rank) culprits.push_back(&b);
    if (silent_rank < 0) {
      // A rank that found the fault in itself, else one that failed other than as a lost peer.
      for (const Heartbeat& b : beats)
        if (b.culprit) culprits.push_back(&b);
      for (const Heartbeat& b : beats)
        if (culprits.empty() && b.exited && b.exit_code != 0 &&
            b.exit_code != int(ExitCode::kTempFail))
          culprits.push_back(&b);
      const int seen = LauncherCulprit(job.Tail(40));
      if (culprits.empty())
        for (const Heartbeat& b : beats)
          if (b.rank == seen) culprits.push_back(&b);
      if (culprits.empty() && !killed)
        for (const Heartbeat& b : beats)
          if (!b.exited) culprits.push_back(&b);  // died without its last beat
    }
    std::string cause = silent_rank >= 0 ? silent : "job " + DescribeStatus(status);
    std::string who;
    for (const Heartbeat* c : culprits) {
      who += (who.empty() ? "" : ", ") + ("rank " + std::to_string(c->rank) + " on " + c->host) +
             (c->exited ? " (exit " + std::to_string(c->exit_code) + ")"
                        : " (no last heartbeat: killed or crashed)") +
             " at step " + std::to_string(c->step) + ", phase " + c->phase;
    }
    if (silent_rank < 0 && !who.empty()) cause += "; " + who;
    if (silent_rank < 0 && who.empty() && !errors.empty()) cause += "; " + errors.front();
    a.outcome = "failed: " + cause;
    attempts_.push_back(a);
    history_.push_back("start " + std::to_string(attempt) + ": " + cause);
    failure_times.push_back(a.end);
    Say("start %d failed: %s", attempt, cause.c_str());
    nlohmann::json fev = {{"event", "failure"},
                          {"attempt", attempt},
                          {"cause", cause},
                          {"exit", DescribeStatus(status)},
                          {"step", a.end_step}};
    if (!culprits.empty()) {
      fev["rank"] = culprits.front()->rank;
      fev["host"] = culprits.front()->host;
    }
    Event(fev);
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

    // Restart, unless the policy says enough.
    const int restarts = attempt;  // a restart would be this many
    if (restarts > spec_.policy.max_restarts) {
      Say("giving up: max_restarts = %d reached. Failures:\n%s", spec_.policy.max_restarts,
          History().c_str());
      return Finish(1, "max restarts");
    }
    if (spec_.policy.window_failures > 0) {
      const double since = a.end - 60 * spec_.policy.window_minutes;
      const auto n = std::count_if(failure_times.begin(), failure_times.end(),
                                   [&](double t) { return t >= since; });
      if (n >= spec_.policy.window_failures) {
        Say("giving up: %ld failures within %g minutes (window_failures). Failures:\n%s", long(n),
            spec_.policy.window_minutes, History().c_str());
        return Finish(1, "failure window");
      }
    }
    consecutive = a.end_step > a.start_step && a.start_step >= 0 ? 1 : consecutive + 1;
    const double wait = std::min(spec_.policy.backoff_max_s,
                                 spec_.policy.backoff_s * std::pow(2.0, consecutive - 1));
    Event({{"event", "restart"}, {"attempt", attempt + 1}, {"backoff_s", wait}});
    Say("restarting in %.1f s (restart %d of at most %d)", wait, restarts,
        spec_.policy.max_restarts);
    for (double t = 0; t < wait; t += 0.1) {
      if (stop.requested()) {
        Say("stop requested while waiting to restart; the newest checkpoint stays as it is");
        return Finish(0, "stopped");
      }
      ::usleep(100000);
    }
  }
}

}  // namespace

int Supervise(const SupervisorSpec& spec) { return Supervisor(spec).Run(); }

}  // namespace keel::resilience
